package idem_test

import (
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// newMemSource is the in-memory broker queue of the Run tests: the test kit's Source, under
// the name "mem" that the tests' dead letters and errors carry.
func newMemSource(msgs ...idem.Message) *idemtest.Source {
	return idemtest.NewSource(idemtest.SourceConfig{Name: "mem"}, msgs...)
}
