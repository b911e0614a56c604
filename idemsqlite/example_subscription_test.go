package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemqueue"
	"github.com/idemkit/idem/idemsqlite"
)

// Two consumers of one topic on the queue table, each on a subscription of its own: the ledger
// and the e-mail consumer both receive every payment, while two ledger processes would share
// the ledger's copies. (A real consumer runs idem.Consumer.Run on each Source.)
func Example_subscriptions() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	store := idemsqlite.New(db)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	var sources []*idemqueue.Source[*sql.Tx]
	for _, name := range []string{"ledger", "email"} {
		src, err := idemqueue.NewSource(store, idemqueue.SourceConfig{Queue: "payment.captured", Subscription: name})
		if err != nil {
			log.Fatal(err)
		}
		// Subscribe before producers start: a subscription gets what is published after it.
		if err := src.Subscribe(ctx); err != nil {
			log.Fatal(err)
		}
		sources = append(sources, src)
	}

	err = idemqueue.NewSink(store).Publish(ctx, "payment.captured",
		idem.Message{EventID: "pay_1", Payload: []byte(`{"amount_cents":4200}`)},
		idem.Message{EventID: "pay_2", Payload: []byte(`{"amount_cents":990}`)})
	if err != nil {
		log.Fatal(err)
	}
	for _, src := range sources {
		ds, err := src.Receive(ctx, 10)
		if err != nil {
			log.Fatal(err)
		}
		for _, d := range ds {
			fmt.Println(src.Name(), d.Message().EventID)
			if err := d.Ack(ctx); err != nil {
				log.Fatal(err)
			}
		}
	}
	// Output:
	// queue:payment.captured#ledger pay_1
	// queue:payment.captured#ledger pay_2
	// queue:payment.captured#email pay_1
	// queue:payment.captured#email pay_2
}
