package serve

import (
	"net/url"
	"strings"
	"testing"
	"time"
)

// FuzzParseFilter: any query string either is refused or gives a filter within its bounds.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"", "consumer=ledger@v1&reason=permanent_error", "age=7d&status=all", "age=-1h",
		"age=99999999999d", "limit=1000", "limit=1001", "status=", "reason=%00", "tenant=%ff%fe"} {
		f.Add(s)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		lf, filter, err := parseFilter(q, now)
		if err != nil {
			return
		}
		if filter.Limit < 1 || filter.Limit > listLimitMax || filter.Limit != lf.Limit {
			t.Fatalf("limit %d out of bounds for %q", filter.Limit, raw)
		}
		if filter.Reason != "" && !filter.Reason.Valid() {
			t.Fatalf("invalid reason %q accepted from %q", filter.Reason, raw)
		}
		if filter.Status != "" && !filter.Status.Valid() {
			t.Fatalf("invalid status %q accepted from %q", filter.Status, raw)
		}
		if !filter.OlderThan.IsZero() && !filter.OlderThan.Before(now) {
			t.Fatalf("age %q selects the future: %s", lf.Age, filter.OlderThan)
		}
	})
}

// FuzzFormIDs: accepted ids are positive, sorted, distinct and at most batchMax.
func FuzzFormIDs(f *testing.F) {
	for _, s := range []string{"1", "1,2,3", " 4 , 4 ", "", ",", "-1", "0", "9223372036854775808", "1e3", strings.Repeat("7,", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		ids, err := formIDs([]string{raw})
		if err != nil {
			return
		}
		if len(ids) == 0 || len(ids) > batchMax {
			t.Fatalf("%d ids accepted from %q", len(ids), raw)
		}
		for i, id := range ids {
			if id < 1 || i > 0 && ids[i-1] >= id {
				t.Fatalf("ids %v from %q are not positive, sorted and distinct", ids, raw)
			}
		}
	})
}
