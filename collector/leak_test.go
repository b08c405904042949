package collector

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine the package's code starts has an owner that stops it:
// none may outlive the tests.
//
// The package's tests publish records without run metadata and look at
// the closed steps right after a Sync: steps are not held for metadata
// here unless a test asks (TestStepsHeldForLateMetadata); the default is
// exercised by the demo and end-to-end tests.
func TestMain(m *testing.M) {
	defaultMetaWait = -1
	goleak.VerifyTestMain(m)
}
