package bench

import (
	"context"
	"fmt"
	"slices"
)

// Case is a case a program adds to a run through Options.Extra, beside the built-in ones: the
// River side-by-side module (cmd/idem/riverbench) adds River's cases this way, so that River
// stays out of the idem command's dependencies.
type Case struct {
	// Name is the name Options.Cases selects the case by; it must not be a built-in case's.
	Name string
	// Run measures the case at one worker count and returns its results (one per mode it
	// measures), each named after the case or a variant of it.
	Run func(ctx context.Context, opts Options, workers int) ([]Result, error)
}

// validateExtra checks the added cases' names; it returns the set of them.
func (o Options) validateExtra(builtin map[string]bool) (map[string]bool, error) {
	names := make(map[string]bool, len(o.Extra))
	for i, x := range o.Extra {
		switch {
		case x.Name == "":
			return nil, fmt.Errorf("bench: Extra[%d]: the case has no name", i)
		case x.Run == nil:
			return nil, fmt.Errorf("bench: Extra[%d] (%s): Run is nil", i, x.Name)
		case builtin[x.Name] || names[x.Name]:
			return nil, fmt.Errorf("bench: Extra[%d]: case %q is already defined", i, x.Name)
		}
		names[x.Name] = true
	}
	return names, nil
}

// runExtra runs the added cases that opts.Cases names, in the order it names them (so a
// program can interleave its cases with idem's to spread a shared machine's noise), at each
// worker count.
func runExtra(ctx context.Context, opts Options, add func(Result, error) error) error {
	for _, name := range opts.Cases {
		i := slices.IndexFunc(opts.Extra, func(x Case) bool { return x.Name == name })
		if i < 0 {
			continue
		}
		for _, conc := range opts.Concurrency {
			rs, err := opts.Extra[i].Run(ctx, opts, conc)
			if err != nil {
				return fmt.Errorf("bench: %s (%d workers): %w", name, conc, err)
			}
			for _, r := range rs {
				if err := add(r, nil); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
