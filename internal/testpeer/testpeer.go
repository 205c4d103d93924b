// Package testpeer finds the Python interpreter that tests compare against (Pillow,
// HF tokenizers, pyarrow, nats-py): $MMFEED_PYTHON, else the repository's .venv.
//
// Without one a test is skipped, unless MMFEED_REQUIRE_PEERS is set (`make test` sets it,
// so CI never skips a peer comparison), in which case it fails.
package testpeer

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Python returns the peer interpreter, or skips (or fails) t when there is none.
func Python(t testing.TB) string {
	t.Helper()
	py := os.Getenv("MMFEED_PYTHON")
	if py == "" {
		_, file, _, _ := runtime.Caller(0)
		py = filepath.Join(filepath.Dir(file), "..", "..", ".venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("MMFEED_REQUIRE_PEERS") != "" {
			t.Fatalf("Python peer %s not found (run `make venv`); MMFEED_REQUIRE_PEERS is set", py)
		}
		t.Skipf("Python peer %s not found; `make test` runs this", py)
	}
	return py
}
