package serve

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Cookie names.
const (
	csrfCookie    = "idem_csrf"
	sessionCookie = "idem_session"
	// nameMax bounds the name a user logs in with (it goes into the audit trail).
	nameMax = 64
	// formMax bounds a POSTed form.
	formMax = 64 << 10
)

// sign is an HMAC of msg under the server's key, hex-encoded.
func (s *Server) sign(purpose, msg string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(purpose + "\x00" + msg))
	return hex.EncodeToString(m.Sum(nil))
}

// csrfToken returns the token forms of this browser carry, setting the browser's CSRF cookie
// (a random nonce) if it has none. The token is the nonce signed with the server's key, so a
// cookie planted by a sibling site is useless without the key.
func (s *Server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	nonce := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 32 {
		nonce = c.Value
	} else {
		var b [16]byte
		_, _ = rand.Read(b[:])
		nonce = hex.EncodeToString(b[:])
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, Path: "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	}
	return s.sign("csrf", nonce)
}

// csrfOK checks a POST: the form's token must match the browser's CSRF cookie, and an Origin
// header, when the browser sends one, must be this server.
func (s *Server) csrfOK(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	want := s.sign("csrf", c.Value)
	return subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(want)) == 1
}

// actionsEnabled reports whether any way to act is configured.
func (s *Server) actionsEnabled() bool {
	return !s.cfg.ReadOnly && (s.cfg.Token != "" || s.cfg.TrustHeader != "")
}

// actor returns who makes the request, for the audit trail: the reverse proxy's header, a
// logged-in session, or a bearer token (named by X-Idem-Actor). Empty means nobody may act.
func (s *Server) actor(r *http.Request) string {
	if h := s.cfg.TrustHeader; h != "" {
		if v := strings.TrimSpace(r.Header.Get(h)); validName(v) {
			return v + " (idem serve)"
		}
	}
	if s.cfg.Token == "" {
		return ""
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		enc, sig, ok := strings.Cut(c.Value, ".")
		raw, derr := base64.RawURLEncoding.DecodeString(enc)
		if ok && derr == nil && hmac.Equal([]byte(sig), []byte(s.sign("session", string(raw)))) && validName(string(raw)) {
			return string(raw) + " (idem serve)"
		}
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && s.tokenOK(tok) {
		name := strings.TrimSpace(r.Header.Get("X-Idem-Actor"))
		if !validName(name) {
			name = "token"
		}
		return name + " (idem serve)"
	}
	return ""
}

// tokenOK compares tok with the configured token in constant time.
func (s *Server) tokenOK(tok string) bool {
	a, b := sha256.Sum256([]byte(tok)), sha256.Sum256([]byte(s.cfg.Token))
	return s.cfg.Token != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// validName accepts a user name for the audit trail: printable UTF-8, at most nameMax bytes.
func validName(v string) bool {
	if strings.TrimSpace(v) == "" || len(v) > nameMax || !utf8.ValidString(v) {
		return false
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "login", s.base(w, r, "Log in", ""), nil)
}

// login checks the token and sets the session cookie naming the user.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, formMax)
	if !s.csrfOK(r) {
		s.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
		return
	}
	if s.cfg.Token == "" {
		s.fail(w, r, http.StatusForbidden, "Logging in with a token is not enabled: start idem serve with --token (or $IDEM_SERVE_TOKEN).")
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if !s.tokenOK(r.PostFormValue("token")) {
		time.Sleep(200 * time.Millisecond) // slow down guessing
		s.fail(w, r, http.StatusForbidden, "Wrong token.")
		return
	}
	if !validName(name) {
		s.fail(w, r, http.StatusBadRequest, "Say who you are (a name of at most 64 printable characters): it goes into the audit trail.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie,
		Value: base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + s.sign("session", name),
		Path:  "/", HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/deadletters", http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, formMax)
	if !s.csrfOK(r) {
		s.fail(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
