// Command idem operates idem: demo, migrate, relay, gc, status, the dead-letter queue (dlq),
// bench and chaos.
// Run "idem --help"; the commands live in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemkit/idem/cmd/idem/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
