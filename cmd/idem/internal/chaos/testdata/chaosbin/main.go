// Command chaosbin is the binary the chaos tests build: `chaosbin chaos-role …` runs one role
// (what the idem command's hidden chaos-role does), and `chaosbin run -pg URL …` runs the
// harness itself, for long runs by hand:
//
//	go build -o /tmp/chaosbin ./internal/chaos/testdata/chaosbin
//	/tmp/chaosbin run -pg "$IDEM_POSTGRES_URL" -duration 10m
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/idem/cmd/idem/internal/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == chaos.RoleCommand {
		if err := chaos.RoleMain(ctx, os.Args[2:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprintln(os.Stderr, "usage: chaosbin run -pg URL|-mysql DSN [-duration D] [-seed N] [-v] | chaosbin chaos-role …")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var o chaos.Options
	var jsonOut bool
	fs.StringVar(&o.PostgresURL, "pg", os.Getenv("IDEM_POSTGRES_URL"), "PostgreSQL URL")
	fs.StringVar(&o.MySQLDSN, "mysql", "", "MySQL or MariaDB DSN (instead of -pg), e.g. root@tcp(127.0.0.1:3306)/test")
	fs.DurationVar(&o.Duration, "duration", chaos.DurationDefault, "chaos duration")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", chaos.DrainTimeoutDefault, "drain timeout")
	fs.IntVar(&o.Rate, "rate", chaos.RateDefault, "events per second")
	fs.IntVar(&o.Consumers, "consumers", chaos.ConsumersDefault, "consumer processes")
	fs.IntVar(&o.Relays, "relays", chaos.RelaysDefault, "relay processes")
	fs.Int64Var(&o.Seed, "seed", 0, "seed (0: random)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the run's schema")
	fs.BoolVar(&o.Verbose, "v", false, "forward the roles' logs")
	fs.BoolVar(&jsonOut, "json", false, "print the report as JSON too")
	_ = fs.Parse(os.Args[2:])
	if o.MySQLDSN != "" {
		o.PostgresURL = ""
	}
	o.Out = os.Stdout
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	o.Logf = logger.Printf
	start := time.Now()
	r, err := chaos.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if jsonOut {
		b, _ := json.MarshalIndent(r, "", "  ")
		fmt.Println(string(b))
	}
	fmt.Printf("total %.1f s\n", time.Since(start).Seconds())
	if !r.OK {
		os.Exit(1)
	}
}
