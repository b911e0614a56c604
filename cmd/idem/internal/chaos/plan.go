package chaos

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Poison kinds, as stored in orders.poison (the demo's values).
const (
	poisonNone         = ""
	poisonInvalidJSON  = "invalid_json"
	poisonMissingField = "missing_field"
	poisonKeyReuse     = "key_reuse"
)

// Poison identities: a valid payment whose event id or tenant is not an identity. The
// producer publishes them straight to the stream, as a foreign producer would (the outbox must
// refuse them), and each must end as exactly one invalid_payload dead letter of its own.
const (
	identBlank    = "id_blank"   // no event id at all
	identSpace    = "id_space"   // Unicode whitespace only (NATS trims ASCII whitespace)
	identControl  = "id_control" // ASCII control characters (and, at the outbox only, CR/LF)
	identNUL      = "id_nul"     // a NUL byte
	identUTF8     = "id_utf8"    // invalid UTF-8
	identLong3K   = "id_3k"      // 3 KB of random characters: past a B-tree entry
	identLong12K  = "id_12k"     // 12 KB: past a PostgreSQL page
	identTenant10 = "tenant_10k" // a valid id with a 10 KB tenant
)

// identKinds lists the poison identities in the order the planner draws them.
var identKinds = [...]string{identBlank, identSpace, identControl, identNUL, identUTF8, identLong3K, identLong12K, identTenant10}

// isIdent reports whether poison is a poison identity.
func isIdent(poison string) bool {
	for _, k := range identKinds {
		if poison == k {
			return true
		}
	}
	return false
}

// Scenario constants shared by the harness and the roles.
const (
	// walletCount is how many wallets the orders of a run credit.
	walletCount = 100
	// keyReuseLookback bounds how far back a key-reuse order looks for the valid order whose
	// event id it reuses.
	keyReuseLookback = 32
	// eventType is the type of every event of the scenario.
	eventType = "payment.captured"
	// consumerName is the consumer the roles run, with its effect version.
	consumerName = "ledger@v1"
)

// order is what the producer does for one order index. It is a pure function of the seed, the
// rates and the index (see planner), so a restarted producer makes the same decisions again.
type order struct {
	index  int
	wallet int
	amount int64
	// poison is one of the poison kinds; "" for a valid order.
	poison string
	// target is, for a key-reuse order, the index of the valid order whose event id it reuses.
	target int
	// duplicate: the outbox gets a second copy of the event, published under another broker
	// message id so that it gets past JetStream's deduplication and reaches the consumers.
	duplicate bool
	// resendShift, when not zero, is a valid order's re-send: the producer enqueues the same
	// event (id and payload) once more with its OccurredAt moved by resendShift (hours to days,
	// either way), as a producer that re-sends with a fresh timestamp does. It must apply nothing.
	resendShift time.Duration
}

func (o order) valid() bool { return o.poison == poisonNone }

// rates are the misbehaviour rates of a run.
type rates struct {
	duplicates, transient, poison float64
}

// planner decides each order as the demo's plan does: every order draws the same values in
// the same order from a PCG seeded by (seed, index), so changing one rate does not reshuffle the
// others. Key-reuse targets depend on the orders before, so the plan is built in index order;
// at is cheap enough (a few draws per order) to rebuild from zero after a restart.
type planner struct {
	seed     int64
	r        rates
	orders   []order
	targeted []bool
}

func newPlanner(seed int64, r rates) *planner { return &planner{seed: seed, r: r} }

// at returns order i, extending the plan up to it.
func (p *planner) at(i int) order {
	for len(p.orders) <= i {
		p.next()
	}
	return p.orders[i]
}

func (p *planner) next() {
	i := len(p.orders)
	rng := rand.New(rand.NewPCG(uint64(p.seed), uint64(i)))
	pPoison, kind := rng.Float64(), rng.IntN(3)
	pDup := rng.Float64()
	o := order{
		index:  i,
		wallet: rng.IntN(walletCount),
		amount: 100 + rng.Int64N(99_901), // 1.00 to 1000.00
		target: -1,
	}
	if pPoison < p.r.poison {
		o.poison = [...]string{poisonInvalidJSON, poisonMissingField, poisonKeyReuse}[kind]
	}
	if o.poison == poisonKeyReuse {
		// Reuse the event id of a recent valid order no other order reuses; without one, this
		// order is another kind of poison.
		for j := i - 1; j >= 0 && j >= i-keyReuseLookback; j-- {
			if p.orders[j].valid() && !p.targeted[j] {
				o.target = j
				break
			}
		}
		if o.target < 0 {
			o.poison = poisonInvalidJSON
		} else {
			p.targeted[o.target] = true
			o.wallet = p.orders[o.target].wallet
			if o.amount == p.orders[o.target].amount {
				o.amount++
			}
		}
	}
	o.duplicate = pDup < p.r.duplicates
	// Draws added later come after the first ones, so that they change no earlier decision.
	pResend, shiftHours, back := rng.Float64(), 1+rng.Int64N(24*3), rng.IntN(2) == 0
	pIdent, identKind := rng.Float64(), rng.IntN(len(identKinds))
	if o.valid() && pIdent < p.r.poison {
		o.poison = identKinds[identKind]
		o.duplicate = false // it never goes through the outbox
	}
	if o.valid() && pResend < p.r.duplicates {
		o.resendShift = time.Duration(shiftHours) * time.Hour
		if back {
			o.resendShift = -o.resendShift
		}
	}
	p.orders = append(p.orders, o)
	p.targeted = append(p.targeted, false)
}

func walletID(w int) string { return fmt.Sprintf("w%03d", w) }

// eventID is the event id of order i of a run; a key-reuse order uses its target's.
func eventID(runID string, i int) string { return runID + "-" + strconv.Itoa(i) }

// eventIDOf returns the event id the message of o carries.
func (o order) eventID(runID string) string {
	if o.poison == poisonKeyReuse {
		return eventID(runID, o.target)
	}
	return eventID(runID, o.index)
}

// payment is the payload of payment.captured. Pointers tell a missing field from a zero one.
type payment struct {
	OrderID     *int64  `json:"order_id"`
	WalletID    *string `json:"wallet_id"`
	AmountCents *int64  `json:"amount_cents"`
	Currency    string  `json:"currency,omitempty"`
}

// payload returns the body of o's message: a valid payment, or the poison o calls for.
func (o order) payload() []byte {
	id := int64(o.index)
	if o.poison == poisonKeyReuse {
		id = int64(o.target) // the same order, captured again with another amount
	}
	w, amt := walletID(o.wallet), o.amount
	p := payment{OrderID: &id, WalletID: &w, AmountCents: &amt, Currency: "EUR"}
	if o.poison == poisonMissingField {
		p.WalletID = nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a struct of plain fields always marshals
	}
	if o.poison == poisonInvalidJSON {
		b = b[:len(b)/2] // cut off mid-object, as a truncated upload would be
	}
	return b
}

// injectTransient decides, from the seed and the event id alone, whether the handler fails
// the event's first attempt: every consumer process, restarted or not, decides the same.
func injectTransient(seed int64, rate float64, eventID string) bool {
	if rate <= 0 {
		return false
	}
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(seed))
	h.Write(b[:])
	h.Write([]byte(eventID))
	// FNV mixes the last bytes of similar ids poorly into the high bits: finish with
	// SplitMix64's finalizer so the fraction is uniform.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11)/float64(uint64(1)<<53) < math.Min(rate, 1)
}

// identSalt separates the random characters of long poison identities from the plan's draws.
const identSalt = 0x1de7_1d5a

// identity returns the event id and tenant o's message carries on the wire, for a poison
// identity (o.poison one of identKinds); a function of the seed and the index alone, so a
// restarted producer sends the same message again. Where the kind allows, the id differs from
// order to order, so that no two poison messages share a dead letter.
func (o order) identity(runID string, seed int64) (id, tenant string) {
	base := eventID(runID, o.index)
	random := func(n int) string {
		const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
		rng := rand.New(rand.NewPCG(uint64(seed)^identSalt, uint64(o.index)))
		b := make([]byte, n)
		for k := range b {
			b[k] = alphabet[rng.IntN(len(alphabet))]
		}
		return base + "-" + string(b)
	}
	switch o.poison {
	case identBlank:
		return "", ""
	case identSpace:
		// The index in base 3, one Unicode space per digit: whitespace only, yet unique.
		spaces := [...]string{"\u00a0", "\u2002", "\u3000"}
		s := spaces[0] + spaces[1] // never empty, even for index 0
		for i := o.index; i > 0; i /= 3 {
			s += spaces[i%3]
		}
		return s, ""
	case identControl:
		return base + "\x01\x1b[2J\x7f", ""
	case identNUL:
		return base + "\x00", ""
	case identUTF8:
		return base + "\xff\xfe\xc3", ""
	case identLong3K:
		return random(3 << 10), ""
	case identLong12K:
		return random(12 << 10), ""
	case identTenant10:
		return base, random(10 << 10)
	}
	return base, ""
}
