package connect

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
)

type fakeURL string

func (u fakeURL) String() string { return string(u) }

// TestNotReachedNamesAuthFailures: a wrong password is reported as such, not as a network
// problem.
func TestNotReachedNamesAuthFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		auth bool
	}{
		{"postgres password", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}), true},
		{"postgres other", &pgconn.PgError{Code: "3D000", Message: "database does not exist"}, false},
		{"mysql access denied", &mysql.MySQLError{Number: 1045, Message: "Access denied for user"}, true},
		{"nats", fmt.Errorf("nats: %w", nats.ErrAuthorization), true},
		{"redis", errors.New("WRONGPASS invalid username-password pair or user is disabled."), true},
		{"rabbitmq", errors.New("Exception (403) Reason: \"username or password not allowed\""), true},
		{"refused", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := notReached("store", fakeURL("postgres://app:xxxxx@db/app"), tt.err)
			if tt.auth {
				require.ErrorContains(t, err, "store postgres://app:xxxxx@db/app rejected the credentials")
				require.NotContains(t, err.Error(), "unreachable")
			} else {
				require.ErrorContains(t, err, "store postgres://app:xxxxx@db/app is unreachable")
			}
		})
	}
}
