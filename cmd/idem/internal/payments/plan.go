package payments

import (
	"encoding/json"
	"math/rand/v2"
	"time"
)

// Poison kinds, as stored in the orders table's poison column.
const (
	PoisonNone         = ""
	PoisonInvalidJSON  = "invalid_json"
	PoisonMissingField = "missing_field"
	PoisonKeyReuse     = "key_reuse"
)

// Poison identities: a valid payment whose event id or tenant is not an identity. A producer
// publishes them straight to the broker, as a foreign producer would (the outbox must refuse
// them), and each must end as exactly one invalid_payload dead letter of its own.
const (
	IdentBlank    = "id_blank"   // no event id at all
	IdentSpace    = "id_space"   // Unicode whitespace only (NATS trims ASCII whitespace)
	IdentControl  = "id_control" // ASCII control characters (and, at the outbox only, CR/LF)
	IdentNUL      = "id_nul"     // a NUL byte
	IdentUTF8     = "id_utf8"    // invalid UTF-8
	IdentLong3K   = "id_3k"      // 3 KB of random characters: past a B-tree entry
	IdentLong12K  = "id_12k"     // 12 KB: past a PostgreSQL page
	IdentTenant10 = "tenant_10k" // a valid id with a 10 KB tenant
)

// IdentKinds lists the poison identities in the order the planner draws them.
var IdentKinds = [...]string{IdentBlank, IdentSpace, IdentControl, IdentNUL, IdentUTF8, IdentLong3K, IdentLong12K, IdentTenant10}

// IsIdent reports whether poison is a poison identity.
func IsIdent(poison string) bool {
	for _, k := range IdentKinds {
		if poison == k {
			return true
		}
	}
	return false
}

// Order is what a producer does for one order index, and how the scenario misbehaves around
// it. It is a pure function of the seed, the rates and the index (see Planner).
type Order struct {
	Index  int
	Wallet int
	Amount int64
	// Poison is one of the poison kinds or identities; "" for a valid order.
	Poison string
	// Target is, for a key-reuse order, the index of the valid order whose event id it reuses.
	Target int
	// Duplicate: the event is published a second time, under a broker message id of its own
	// so that the broker's deduplication lets it through and the consumers see it.
	Duplicate bool
	// ResendShift, when not zero, is a valid order's re-send: the same event (id and payload)
	// once more with its OccurredAt moved by ResendShift (hours to days, either way), as a
	// producer that re-sends with a fresh timestamp does. It must apply nothing.
	ResendShift time.Duration
	// Transient is how many first attempts the handler fails with idem.Transient (0, 1 or 2).
	Transient int
	// Crash: the ack after the first successful commit is lost, so the broker redelivers.
	Crash bool
}

// Valid reports whether o is a valid payment.
func (o Order) Valid() bool { return o.Poison == PoisonNone }

// EventID returns the event id o's message carries: a key-reuse order reuses its target's.
func (o Order) EventID(runID string) string {
	if o.Poison == PoisonKeyReuse {
		return EventID(runID, o.Target)
	}
	return EventID(runID, o.Index)
}

// Payload returns the body of o's message: a valid payment, or the poison o calls for.
func (o Order) Payload() []byte {
	id := int64(o.Index)
	if o.Poison == PoisonKeyReuse {
		id = int64(o.Target) // the same order, captured again with another amount
	}
	w, amt := WalletID(o.Wallet), o.Amount
	p := Payment{OrderID: &id, WalletID: &w, AmountCents: &amt, Currency: "EUR"}
	if o.Poison == PoisonMissingField {
		p.WalletID = nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a struct of plain fields always marshals
	}
	if o.Poison == PoisonInvalidJSON {
		b = b[:len(b)/2] // cut off mid-object, as a truncated upload would be
	}
	return b
}

// Rates are the misbehaviour rates of a plan, each in [0, 1].
type Rates struct {
	// Duplicates: orders published twice. Poison: orders with an invalid payload or a reused
	// key. Idents: valid orders turned into poison identities. Resends: valid orders re-sent
	// with another OccurredAt. Transient: valid orders whose first one or two attempts fail.
	// Crash: valid orders whose first ack is lost.
	Duplicates, Poison, Idents, Resends, Transient, Crash float64
}

// Planner decides each order: every order draws the same values in the same order from a PCG
// seeded by (seed, index), whatever the rates, so one seed injects the same misbehaviour into
// the same orders and changing one rate does not reshuffle the others. Key-reuse targets depend
// on the orders before, so the plan is built in index order; At is cheap enough (a few draws
// per order) to rebuild from zero after a restart.
type Planner struct {
	seed     int64
	r        Rates
	orders   []Order
	targeted []bool
}

// NewPlanner returns the planner of seed and r.
func NewPlanner(seed int64, r Rates) *Planner { return &Planner{seed: seed, r: r} }

// Plan returns the first n orders of seed and r.
func Plan(seed int64, n int, r Rates) []Order {
	p := NewPlanner(seed, r)
	if n > 0 {
		p.At(n - 1)
	}
	return p.orders[:n:n]
}

// At returns order i, extending the plan up to it.
func (p *Planner) At(i int) Order {
	for len(p.orders) <= i {
		p.next()
	}
	return p.orders[i]
}

func (p *Planner) next() {
	i := len(p.orders)
	rng := rand.New(rand.NewPCG(uint64(p.seed), uint64(i)))
	pPoison, kind := rng.Float64(), rng.IntN(3)
	pDup := rng.Float64()
	o := Order{
		Index:  i,
		Wallet: rng.IntN(WalletCount),
		Amount: 100 + rng.Int64N(99_901), // 1.00 to 1000.00
		Target: -1,
	}
	if pPoison < p.r.Poison {
		o.Poison = [...]string{PoisonInvalidJSON, PoisonMissingField, PoisonKeyReuse}[kind]
	}
	if o.Poison == PoisonKeyReuse {
		// Reuse the event id of a recent valid order no other order reuses; without one, this
		// order is another kind of poison.
		for j := i - 1; j >= 0 && j >= i-KeyReuseLookback; j-- {
			if p.orders[j].Valid() && !p.targeted[j] {
				o.Target = j
				break
			}
		}
		if o.Target < 0 {
			o.Poison = PoisonInvalidJSON
		} else {
			p.targeted[o.Target] = true
			o.Wallet = p.orders[o.Target].Wallet
			if o.Amount == p.orders[o.Target].Amount {
				o.Amount++
			}
		}
	}
	o.Duplicate = pDup < p.r.Duplicates
	// Draws added later come after the first ones, so that they change no earlier decision.
	pResend, shiftHours, back := rng.Float64(), 1+rng.Int64N(24*3), rng.IntN(2) == 0
	pIdent, identKind := rng.Float64(), rng.IntN(len(IdentKinds))
	pTransient, fails := rng.Float64(), 1+rng.IntN(2)
	pCrash := rng.Float64()
	if o.Valid() && pIdent < p.r.Idents {
		o.Poison = IdentKinds[identKind]
		o.Duplicate = false // it never goes through the outbox
	}
	if o.Valid() {
		if pResend < p.r.Resends {
			o.ResendShift = time.Duration(shiftHours) * time.Hour
			if back {
				o.ResendShift = -o.ResendShift
			}
		}
		if pTransient < p.r.Transient {
			o.Transient = fails
		}
		o.Crash = pCrash < p.r.Crash
	}
	p.orders = append(p.orders, o)
	p.targeted = append(p.targeted, false)
}

// identSalt separates the random characters of long poison identities from the plan's draws.
const identSalt = 0x1de7_1d5a

// Identity returns the event id and tenant o's message carries on the wire, for a poison
// identity (o.Poison one of IdentKinds); a function of the seed and the index alone, so a
// restarted producer sends the same message again. Where the kind allows, the id differs from
// order to order, so that no two poison messages share a dead letter.
func (o Order) Identity(runID string, seed int64) (id, tenant string) {
	base := EventID(runID, o.Index)
	random := func(n int) string {
		const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"
		rng := rand.New(rand.NewPCG(uint64(seed)^identSalt, uint64(o.Index)))
		b := make([]byte, n)
		for k := range b {
			b[k] = alphabet[rng.IntN(len(alphabet))]
		}
		return base + "-" + string(b)
	}
	switch o.Poison {
	case IdentBlank:
		return "", ""
	case IdentSpace:
		// The index in base 3, one Unicode space per digit: whitespace only, yet unique.
		spaces := [...]string{"\u00a0", "\u2002", "\u3000"}
		s := spaces[0] + spaces[1] // never empty, even for index 0
		for i := o.Index; i > 0; i /= 3 {
			s += spaces[i%3]
		}
		return s, ""
	case IdentControl:
		return base + "\x01\x1b[2J\x7f", ""
	case IdentNUL:
		return base + "\x00", ""
	case IdentUTF8:
		return base + "\xff\xfe\xc3", ""
	case IdentLong3K:
		return random(3 << 10), ""
	case IdentLong12K:
		return random(12 << 10), ""
	case IdentTenant10:
		return base, random(10 << 10)
	}
	return base, ""
}
