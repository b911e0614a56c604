package idempg

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
)

// QueueRelease gives back job id that a fetch leased but nobody received (the receive's context
// ended as the fetch committed): it ends the lease and takes back the attempt the fetch counted,
// so the job is available at once, as if never fetched. A job whose attempts go back to 0 also
// loses its first-fetch time: it never really ran, so its retry budget has not started. It is fenced by token like Nak; a lease
// no longer held is an error wrapping idem.ErrLeaseLost.
func (s *Store) QueueRelease(ctx context.Context, id, token int64) error {
	q := `UPDATE "` + s.cfg.Schema + `"."` + s.cfg.Prefix + `queue"
		SET lease_until = NULL,
			first_fetched_at = CASE WHEN attempts <= 1 THEN NULL ELSE first_fetched_at END,
			attempts = greatest(attempts - 1, 0)
		WHERE id = $1 AND token = $2 AND lease_until IS NOT NULL`
	tag, err := s.pool.Exec(ctx, q, id, token)
	if err != nil {
		return fmt.Errorf("idempg: release queue job %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idempg: release queue job %d with token %d: %w", id, token, idem.ErrLeaseLost)
	}
	return nil
}
