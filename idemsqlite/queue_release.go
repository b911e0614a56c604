package idemsqlite

import (
	"context"
	"fmt"
)

// QueueRelease gives back job id that a fetch leased but nobody received (the receive's context
// ended as the fetch committed): it ends the lease and takes back the attempt the fetch counted,
// so the job is available at once, as if never fetched. A job whose attempts go back to 0 also
// loses its first-fetch time: it never really ran, so its retry budget has not started. It is fenced by token like QueueNak; a
// lease no longer held is an error wrapping idem.ErrLeaseLost.
func (s *Store) QueueRelease(ctx context.Context, id, token int64) error {
	res, err := s.execWrite(ctx, s.q.queueRelease, id, token)
	if err != nil {
		return fmt.Errorf("idemsqlite: release queue job %d: %w", id, err)
	}
	if err := s.forgetOnSuccess(leaseCheck(res, "release", id, token), id, token); err != nil {
		return err
	}
	s.queueWake.signal() // available again at once
	return nil
}
