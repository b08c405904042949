package natsconn

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package's code starts has an owner that stops it:
// none may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
