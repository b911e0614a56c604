package idemrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/idemstore"
)

// partitionLease is what the relay knows of one partition lease it holds.
type partitionLease struct {
	token int64
	// until is when the lease ends unless renewed: the Now passed to LeaseAcquire plus the TTL,
	// which is exactly the lease_until the store wrote. No other relay can take the lease
	// before it.
	until time.Time
	// draining marks a partition above the fair share: no new round starts on it, and it is
	// released once the current round is over.
	draining bool
}

// memberLease is the name of this relay's membership lease.
func (r *Relay) memberLease() string { return MemberLeasePrefix + r.cfg.ID }

// partitionLeaseName is the name of partition p's lease.
func partitionLeaseName(p int) string { return PartitionLeasePrefix + strconv.Itoa(p) }

// parsePartition reads the partition number from a partition lease name.
func parsePartition(name string, n int) (int, bool) {
	s, ok := strings.CutPrefix(name, PartitionLeasePrefix)
	if !ok {
		return 0, false
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 0 || p >= n {
		return 0, false
	}
	return p, true
}

// maintain is one step of work sharing: renew the membership lease, count the live relays,
// renew the partitions held, mark those above the fair share ceil(N/members) for release, and
// acquire free or expired partitions up to it. It reports whether it acquired any.
func (r *Relay) maintain(ctx context.Context) (acquired bool, err error) {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	defer func() { r.nextMaintain = r.cfg.Now().Add(r.cfg.LeaseTTL / 3) }()

	ttl := r.cfg.LeaseTTL
	now := r.cfg.Now()
	_, ok, err := r.store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: r.memberLease(), Owner: r.cfg.ID, TTL: ttl, Now: now})
	if err != nil {
		return false, fmt.Errorf("idemrelay: relay %s: renew membership lease: %w", r.cfg.ID, err)
	}
	if !ok {
		// The lease is named after this relay and owned by it, so only a store that broke its
		// contract refuses it.
		return false, fmt.Errorf("idemrelay: relay %s: membership lease %q was refused", r.cfg.ID, r.memberLease())
	}
	members, err := r.store.LeaseList(ctx, MemberLeasePrefix, now)
	if err != nil {
		return false, fmt.Errorf("idemrelay: relay %s: list relay members: %w", r.cfg.ID, err)
	}
	live := len(members)
	if !slices.ContainsFunc(members, func(l idemstore.Lease) bool { return l.Owner == r.cfg.ID }) {
		live++ // our own lease may look expired to a store with another clock; count us anyway
	}
	share := (r.partitions + live - 1) / live

	held, err := r.store.LeaseList(ctx, PartitionLeasePrefix, now)
	if err != nil {
		return false, fmt.Errorf("idemrelay: relay %s: list partition leases: %w", r.cfg.ID, err)
	}
	holder := make(map[int]idemstore.Lease, len(held))
	for _, l := range held {
		if p, ok := parsePartition(l.Name, r.partitions); ok {
			holder[p] = l
		}
	}

	// Renew what we hold, and adopt what the store says we hold but we forgot (a restart with
	// the same ID before the old leases expired).
	r.mu.Lock()
	mine := make([]int, 0, len(r.owned))
	for p := range r.owned {
		mine = append(mine, p)
	}
	r.mu.Unlock()
	for p, l := range holder {
		if l.Owner == r.cfg.ID && !slices.Contains(mine, p) {
			mine = append(mine, p)
		}
	}
	slices.Sort(mine)
	for _, p := range mine {
		at := r.cfg.Now()
		token, ok, err := r.store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: partitionLeaseName(p), Owner: r.cfg.ID, TTL: ttl, Now: at})
		if err != nil {
			return acquired, fmt.Errorf("idemrelay: relay %s: renew lease of partition %d: %w", r.cfg.ID, p, err)
		}
		r.mu.Lock()
		if ok {
			pl := r.owned[p]
			if pl == nil {
				pl = &partitionLease{}
				r.owned[p] = pl
			}
			pl.token, pl.until = token, at.Add(ttl)
		} else if _, had := r.owned[p]; had {
			delete(r.owned, p)
			r.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idemrelay: partition lease lost",
				slog.String("relay", r.cfg.ID), slog.Int("partition", p))
		}
		r.mu.Unlock()
	}

	// Balance: drain what is above the share, take back drained partitions when below it.
	r.mu.Lock()
	var active, draining []int
	for p, pl := range r.owned {
		if pl.draining {
			draining = append(draining, p)
		} else {
			active = append(active, p)
		}
	}
	slices.Sort(active)
	slices.Sort(draining)
	for len(active) > share {
		p := active[len(active)-1]
		active = active[:len(active)-1]
		r.owned[p].draining = true
	}
	for len(active) < share && len(draining) > 0 {
		p := draining[0]
		draining = draining[1:]
		r.owned[p].draining = false
		active = append(active, p)
	}
	need := share - len(active)
	var free []int
	if need > 0 {
		for p := range r.partitions {
			if _, ours := r.owned[p]; ours {
				continue
			}
			if l, taken := holder[p]; taken && l.Owner != r.cfg.ID {
				continue
			}
			free = append(free, p)
		}
	}
	r.mu.Unlock()

	// Start at a random free partition so that relays starting together contend less.
	if len(free) > 0 {
		k := rand.IntN(len(free))
		free = append(free[k:], free[:k]...)
	}
	for _, p := range free {
		if need == 0 {
			break
		}
		at := r.cfg.Now()
		token, ok, err := r.store.LeaseAcquire(ctx, idemstore.LeaseParams{Name: partitionLeaseName(p), Owner: r.cfg.ID, TTL: ttl, Now: at})
		if err != nil {
			return acquired, fmt.Errorf("idemrelay: relay %s: acquire lease of partition %d: %w", r.cfg.ID, p, err)
		}
		if !ok {
			continue // another relay was quicker
		}
		r.mu.Lock()
		r.owned[p] = &partitionLease{token: token, until: at.Add(ttl)}
		r.mu.Unlock()
		need--
		acquired = true
		r.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idemrelay: partition acquired",
			slog.String("relay", r.cfg.ID), slog.Int("partition", p), slog.Int64("token", token))
	}
	return acquired, nil
}

// releaseDraining gives up the partitions marked for release. The relay calls it between
// rounds only, so a partition is never released while its rows are being published.
func (r *Relay) releaseDraining(ctx context.Context) error {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	r.mu.Lock()
	var drain []int
	for p, pl := range r.owned {
		if pl.draining {
			drain = append(drain, p)
		}
	}
	r.mu.Unlock()
	slices.Sort(drain)
	var errs []error
	for _, p := range drain {
		// Forget it first: if the release fails, the lease simply expires.
		r.mu.Lock()
		delete(r.owned, p)
		r.mu.Unlock()
		if err := r.store.LeaseRelease(ctx, partitionLeaseName(p), r.cfg.ID); err != nil {
			errs = append(errs, fmt.Errorf("idemrelay: relay %s: release partition %d: %w", r.cfg.ID, p, err))
			continue
		}
		r.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "idemrelay: partition released",
			slog.String("relay", r.cfg.ID), slog.Int("partition", p))
	}
	return errors.Join(errs...)
}

// releaseAll gives up every partition lease and then the membership lease, so that the other
// relays take the work over at once instead of after the TTL.
func (r *Relay) releaseAll(ctx context.Context) error {
	r.leaseMu.Lock()
	defer r.leaseMu.Unlock()
	r.mu.Lock()
	all := make([]int, 0, len(r.owned))
	for p := range r.owned {
		all = append(all, p)
	}
	clear(r.owned)
	r.mu.Unlock()
	slices.Sort(all)
	var errs []error
	for _, p := range all {
		if err := r.store.LeaseRelease(ctx, partitionLeaseName(p), r.cfg.ID); err != nil {
			errs = append(errs, fmt.Errorf("idemrelay: relay %s: release partition %d: %w", r.cfg.ID, p, err))
		}
	}
	if err := r.store.LeaseRelease(ctx, r.memberLease(), r.cfg.ID); err != nil {
		errs = append(errs, fmt.Errorf("idemrelay: relay %s: release membership: %w", r.cfg.ID, err))
	}
	r.nextMaintain = time.Time{}
	return errors.Join(errs...)
}

// landingMargin is how much of a lease a publish leaves unused: a publish under a lease is cut
// off this long before the lease ends, and a new round needs at least this much left. A broker
// client cut off by its context may already have sent what it was given; the margin is the
// time those messages have to land while the lease still holds, before another relay can take
// the partition and publish the key's next rows.
func (r *Relay) landingMargin() time.Duration { return r.cfg.LeaseTTL / 10 }

// publishBy reports until when a publish on partition p may run (zero when it is not held any
// more): the end of its lease less the landing margin.
func (r *Relay) publishBy(p int) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pl, ok := r.owned[p]; ok {
		return pl.until.Add(-r.landingMargin())
	}
	return time.Time{}
}

// usable returns, in order, the partitions a new round may work on at now (held, not draining,
// with more than the landing margin left).
func (r *Relay) usable(now time.Time) []int {
	margin := r.landingMargin()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, 0, len(r.owned))
	for p, pl := range r.owned {
		if !pl.draining && now.Add(margin).Before(pl.until) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Partitions returns the partitions this relay holds a lease on at the moment, in order, for
// status pages and tests.
func (r *Relay) Partitions() []int {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, 0, len(r.owned))
	for p, pl := range r.owned {
		if now.Before(pl.until) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
