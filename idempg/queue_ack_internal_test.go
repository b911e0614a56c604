package idempg

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestAckLost: queueAckCommit's failure is recognised by its code and marker whatever language
// the server writes its messages in, and the ids it lists are read up to the closing quote.
func TestAckLost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		code    string
		message string
		want    []string
		ok      bool
	}{
		{"english", "22P02", `invalid input syntax for type integer: "` + ackLostMarker + `12 15"`, []string{"12", "15"}, true},
		{"german", "22P02", `ungültige Eingabesyntax für Typ integer: »` + ackLostMarker + `7«`, []string{"7"}, true},
		{"none deleted", "22P02", `invalid input syntax for type integer: "` + ackLostMarker + `"`, []string{}, true},
		{"another cast", "22P02", `invalid input syntax for type integer: "abc"`, nil, false},
		{"another code", "23505", `duplicate key value ` + ackLostMarker, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := ackLost(&pgconn.PgError{Code: tt.code, Message: tt.message})
			require.Equal(t, tt.ok, ok)
			require.Equal(t, tt.want, got)
		})
	}
}
