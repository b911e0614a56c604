package serve

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemdlq"
)

// actionKind is replay or discard.
type actionKind string

const (
	actReplay  actionKind = "replay"
	actDiscard actionKind = "discard"
)

// confirmData is the preview of an action: what it would touch, before the person confirms.
type confirmData struct {
	Action  actionKind
	IDs     []int64
	Pending []idem.DeadLetter
	// Skipped are selected dead letters that are no longer pending: the action leaves them.
	Skipped []idem.DeadLetter
	Missing []int64
	Reason  string
	Note    string
	// Destination says where replays go.
	Destination string
}

// action handles POST /deadletters/replay and /deadletters/discard. Every guard answers 403:
// read-only mode, no way to act configured, a bad CSRF token, nobody authenticated. A request
// without confirm=yes only previews what it would touch; discard needs a reason at both steps.
func (s *Server) action(kind actionKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, formMax)
		switch {
		case s.cfg.ReadOnly:
			s.fail(w, r, http.StatusForbidden, "This dashboard is read-only (idem serve --read-only): nothing can be replayed or discarded here.")
			return
		case !s.actionsEnabled():
			s.fail(w, r, http.StatusForbidden, "Actions are disabled: start idem serve with --token (or $IDEM_SERVE_TOKEN) or --trust-header behind an authenticating proxy.")
			return
		case !s.csrfOK(r):
			s.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
			return
		}
		actor := s.actor(r)
		if actor == "" {
			s.fail(w, r, http.StatusForbidden, "You are not logged in: log in with the dashboard's token (or come through the authenticating proxy) to "+string(kind)+".")
			return
		}
		ids, err := formIDs(r.PostForm["id"])
		if err != nil {
			s.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
		reason := strings.TrimSpace(r.PostFormValue("reason"))
		if kind == actDiscard && reason == "" {
			s.fail(w, r, http.StatusBadRequest, "A discard needs a reason: say why these dead letters are dropped (it goes into the audit trail). Nothing was discarded.")
			return
		}
		note := strings.TrimSpace(r.PostFormValue("note"))
		if r.PostFormValue("confirm") != "yes" {
			s.preview(w, r, kind, ids, reason, note)
			return
		}
		sel := idemdlq.Selection{IDs: ids, Limit: len(ids), Actor: actor}
		var (
			done []int64
			verb = "Replayed"
		)
		if kind == actReplay {
			sel.Reason = note
			if s.cfg.Replayer == nil {
				s.fail(w, r, http.StatusForbidden, "Replay is not configured on this dashboard.")
				return
			}
			var res idemdlq.ReplayResult
			res, err = s.cfg.Replayer.Replay(r.Context(), idemdlq.ReplayParams{Selection: sel, Topic: s.cfg.Topic, ArrivalTopic: s.cfg.ArrivalTopic})
			done = res.Replayed
		} else {
			sel.Reason, verb = reason, "Discarded"
			rp := s.cfg.Replayer
			if rp == nil {
				rp = idemdlq.NewReplayer(s.cfg.Stores.DeadLetters, nil, idemdlq.ReplayerConfig{})
			}
			// Ids select exactly (Limit is their count): nothing remains.
			var res idemdlq.DiscardResult
			res, err = rp.Discard(r.Context(), sel)
			done = res.Discarded
		}
		msg := fmt.Sprintf("%s %s as %s.", verb, countText(len(done), idList(done)), actor)
		if len(done) == 0 {
			msg = fmt.Sprintf("%s nothing: none of the selected dead letters is pending any more.", verb)
		}
		if err != nil {
			s.cfg.Logger.Error("idem serve: "+string(kind), "error", err.Error(), "actor", actor)
			if len(done) > 0 {
				msg += " Then it failed: " + err.Error()
			} else {
				s.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("The %s failed: %v", kind, err))
				return
			}
		}
		// Post/redirect/get: reloading the result does not send the form again. The message is
		// signed so that a link cannot make the page claim what did not happen.
		q := url.Values{"done": {msg}, "sig": {s.sign("flash", msg)}}
		http.Redirect(w, r, "/audit?"+q.Encode(), http.StatusSeeOther)
	}
}

// preview shows what an action would touch and asks to confirm.
func (s *Server) preview(w http.ResponseWriter, r *http.Request, kind actionKind, ids []int64, reason, note string) {
	d := confirmData{Action: kind, IDs: ids, Reason: reason, Note: note, Destination: "the queue each one came from (its source)"}
	switch {
	case s.cfg.Topic != "":
		d.Destination = s.cfg.Topic
	case s.cfg.ArrivalTopic:
		d.Destination = "the subject each one arrived on"
	}
	for _, id := range ids {
		dl, err := s.cfg.Stores.DeadLetters.GetDeadLetter(r.Context(), id)
		switch {
		case errors.Is(err, idem.ErrNotFound):
			d.Missing = append(d.Missing, id)
		case err != nil:
			s.storeFail(w, r, fmt.Sprintf("read dead letter %d", id), err)
			return
		case dl.Status == idem.DeadLetterPending:
			d.Pending = append(d.Pending, dl)
		default:
			d.Skipped = append(d.Skipped, dl)
		}
	}
	title := "Replay dead letters?"
	if kind == actDiscard {
		title = "Discard dead letters?"
	}
	s.render(w, r, http.StatusOK, "confirm", s.base(w, r, title, "deadletters"), d)
}

// formIDs parses the selected ids: at least one, at most batchMax, each a positive number.
func formIDs(raw []string) ([]int64, error) {
	var ids []int64
	for _, v := range raw {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			id, err := strconv.ParseInt(f, 10, 64)
			if err != nil || id < 1 {
				return nil, fmt.Errorf("%q is not a dead-letter id", f)
			}
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("select at least one dead letter")
	case len(ids) > batchMax:
		return nil, fmt.Errorf("%d dead letters selected; at most %d at a time", len(ids), batchMax)
	}
	return ids, nil
}

// countText is "1 dead letter (#4)" or "3 dead letters (#4, #5, #9)".
func countText(n int, ids string) string {
	if n == 1 {
		return "1 dead letter (" + ids + ")"
	}
	return strconv.Itoa(n) + " dead letters (" + ids + ")"
}

// idList is "#4, #5, #9".
func idList(ids []int64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = "#" + strconv.FormatInt(id, 10)
	}
	return strings.Join(parts, ", ")
}
