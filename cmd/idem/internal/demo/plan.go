package demo

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
)

// Poison kinds, as stored in demo_orders.poison.
const (
	poisonNone         = ""
	poisonInvalidJSON  = "invalid_json"
	poisonMissingField = "missing_field"
	poisonKeyReuse     = "key_reuse"
)

// walletCount is how many wallets the orders of one run credit.
const walletCount = 100

// keyReuseLookback bounds how far back a key-reuse order looks for a valid order to reuse the
// event id of.
const keyReuseLookback = 32

// order is what the producer means to do for one order index, and how the demo misbehaves
// around it. It is a pure function of the seed and the index (see newPlan).
type order struct {
	index  int
	wallet int
	amount int64
	// poison is one of the poison kinds; "" for a valid order.
	poison string
	// target is, for a key-reuse order, the index of the valid order whose event id it reuses.
	target int
	// duplicate: the relay's sink publishes this order's message twice.
	duplicate bool
	// transient is how many first attempts the handler fails with idem.Transient (0, 1 or 2).
	transient int
	// crash: the ack after the first successful commit is lost, so the broker redelivers.
	crash bool
}

func (o order) valid() bool { return o.poison == poisonNone }

// rates are the misbehaviour rates of a plan.
type rates struct {
	duplicates, transient, poison, crash float64
}

// newPlan decides, for each of n orders, its wallet, amount and misbehaviour. Every order
// draws the same values in the same order from a PCG seeded by (seed, index), whatever the
// rates, so one seed injects the same misbehaviour into the same orders and changing one rate
// does not reshuffle the others.
func newPlan(seed int64, n int, r rates) []order {
	plan := make([]order, n)
	targeted := make([]bool, n)
	for i := range plan {
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(i)))
		pPoison, kind := rng.Float64(), rng.IntN(3)
		pDup := rng.Float64()
		pTransient, fails := rng.Float64(), 1+rng.IntN(2)
		pCrash := rng.Float64()
		o := order{
			index:  i,
			wallet: rng.IntN(walletCount),
			amount: 100 + rng.Int64N(99_901), // 1.00 to 1000.00
			target: -1,
		}
		if pPoison < r.poison {
			o.poison = [...]string{poisonInvalidJSON, poisonMissingField, poisonKeyReuse}[kind]
		}
		if o.poison == poisonKeyReuse {
			// Reuse the event id of a recent valid order that no other order reuses; without
			// one, this order is a different kind of poison.
			for j := i - 1; j >= 0 && j >= i-keyReuseLookback; j-- {
				if plan[j].valid() && !targeted[j] {
					o.target = j
					break
				}
			}
			if o.target < 0 {
				o.poison = poisonInvalidJSON
			} else {
				targeted[o.target] = true
				o.wallet = plan[o.target].wallet
				if o.amount == plan[o.target].amount {
					o.amount++
				}
			}
		}
		o.duplicate = pDup < r.duplicates
		if o.valid() {
			if pTransient < r.transient {
				o.transient = fails
			}
			o.crash = pCrash < r.crash
		}
		plan[i] = o
	}
	return plan
}

// Names and payloads of the scenario.
const (
	eventType = "payment.captured"
	// headerOrder carries the order index on every message, so that the misbehaviour wrappers
	// find an order's plan; headers are not part of the fingerprint.
	headerOrder = "Demo-Order"
)

func walletID(w int) string { return fmt.Sprintf("w%03d", w) }

// eventID is the event id of order index i of a run: "<run_id>-<i>". A key-reuse order uses
// its target's event id.
func eventID(runID string, i int) string { return runID + "-" + strconv.Itoa(i) }

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
	switch o.poison {
	case poisonMissingField:
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

// orderOf returns the order index a message carries in its Demo-Order header, or -1.
func orderOf(headers map[string]string, n int) int {
	s, ok := headers[headerOrder]
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= n {
		return -1
	}
	return i
}
