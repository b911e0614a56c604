package idemwebhook_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemstore"
	"github.com/idemkit/idem/idemwebhook"
)

// One ingress per provider endpoint, each in front of the consumer whose handler applies the
// event. (Runnable with a store in the examples module: Example_webhook.)
func ExampleNew() {
	var store idemstore.Store[*sql.Tx] // idemsqlite.New(db), or idempg.New(pool) with pgx.Tx
	consumer, err := idem.NewConsumer(store, idem.ConsumerConfig[*sql.Tx]{
		Name: "orders@v1",
		Handler: func(ctx context.Context, tx *sql.Tx, msg idem.Message) error {
			// msg.EventID is QStash's message id, msg.Tenant the signing key's tenant.
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	qstash, err := idemwebhook.NewQStash(idemwebhook.QStashConfig{
		URL: "https://shop.example.com/hooks/qstash", // exactly as configured in QStash
		Secrets: []idemwebhook.Secret{
			{Tenant: "shop-eu", Key: []byte(os.Getenv("QSTASH_CURRENT_SIGNING_KEY"))},
			{Tenant: "shop-eu", Key: []byte(os.Getenv("QSTASH_NEXT_SIGNING_KEY"))},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ingress, err := idemwebhook.New(consumer, idemwebhook.Config{Verifier: qstash, DeadLetters: store})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/qstash", ingress)
	log.Fatal(http.ListenAndServe(":8080", mux))
}

// A verifier on its own: what the ingress learns from a GitHub delivery, and what it refuses.
func ExampleGitHub_Verify() {
	secret := []byte("gh-webhook-secret-0123456789")
	gh, err := idemwebhook.NewGitHub(idemwebhook.GitHubConfig{Secrets: []idemwebhook.Secret{{Tenant: "acme", Key: secret}}})
	if err != nil {
		panic(err)
	}
	body := []byte(`{"action":"opened","number":7}`)
	req := httptest.NewRequest(http.MethodPost, "/hooks/github", strings.NewReader(string(body)))
	req.Header.Set(idemwebhook.HeaderGitHubSignature, idemwebhook.SignGitHub(secret, body))
	req.Header.Set(idemwebhook.HeaderGitHubDelivery, "72d3162e-cc78-11e3-81ab-4c9367dc0958")
	req.Header.Set(idemwebhook.HeaderGitHubEvent, "pull_request")

	v, err := gh.Verify(req, body)
	fmt.Println(v.EventID, v.Tenant, v.Type, err)

	_, err = gh.Verify(req, []byte(`{"action":"closed","number":7}`))
	fmt.Println(err)
	// Output:
	// 72d3162e-cc78-11e3-81ab-4c9367dc0958 acme pull_request <nil>
	// idem: message not authenticated: idemwebhook: signature does not match the request (matches none of the 1 webhook secrets): the body was changed after signing, or signed with another secret
}
