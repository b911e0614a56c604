package idemhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkit/idem/idemhttp"
)

// A receiving service checks the signature before it trusts anything in the request, then
// applies the effect once per Idempotency-Key.
func ExampleVerify() {
	secret := []byte("shared-secret-of-32-bytes-or-more")
	applied := map[string]bool{}
	handler := func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err := idemhttp.Verify(secret, r, body, time.Now(), 5*time.Minute); err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		key := r.Header.Get(idemhttp.HeaderIdempotencyKey)
		if !applied[key] { // in a real service: a unique key in the same transaction as the effect
			applied[key] = true
			fmt.Println("applied", key)
		}
		w.WriteHeader(http.StatusOK)
	}

	body := `{"amount":5}`
	for _, s := range []string{"shared-secret-of-32-bytes-or-more", "shared-secret-of-32-bytes-or-more", "wrong-secret-of-32-bytes-or-more!"} {
		req := httptest.NewRequest(http.MethodPost, "/hooks/payments", strings.NewReader(body))
		req.Header.Set(idemhttp.HeaderIdempotencyKey, idemhttp.IdempotencyKey("acme", "pay-1"))
		req.Header.Set(idemhttp.SignatureHeaderDefault, idemhttp.Sign([]byte(s), "", time.Now(), idemhttp.RequestOf(req, []byte(body))))
		rec := httptest.NewRecorder()
		handler(rec, req)
		fmt.Println(rec.Code)
	}
	// Output:
	// applied acme:pay-1
	// 200
	// 200
	// 401
}
