//go:build !unix

package chaos

import (
	"context"
	"errors"
	"time"
)

// supervisor needs process groups, which only Unix has; elsewhere the harness cannot start.
type supervisor struct{}

var errNoProcessGroups = errors.New("chaos: the harness needs Unix process groups")

func newSupervisor(context.Context, string, []string, bool, func(string, ...any), func(string, string, int)) *supervisor {
	return &supervisor{}
}

func (*supervisor) start(string, string, []string) error { return errNoProcessGroups }
func (*supervisor) running() []string                    { return nil }
func (*supervisor) kill(string) bool                     { return false }
func (*supervisor) stop(string, time.Duration) bool      { return false }
func (*supervisor) restart(string) error                 { return errNoProcessGroups }
func (*supervisor) setRestartOnExit(bool)                {}
func (*supervisor) unexpectedExits() int                 { return 0 }
func (*supervisor) killAll()                             {}
