package sweeper

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any test leaves a goroutine behind: every
// Sweeper started by a test must be joined by Stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
