package e2e_test

import (
	"os"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

// TestMain runs the tests and names, in one line, the service variables whose absence made
// tests skip.
func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }
