//go:build !linux

package loader

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// walkDirFlags open a directory on the way down in walkBeneath.
const walkDirFlags = unix.O_RDONLY | unix.O_DIRECTORY

// errNoOpenat2 says there is no openat2 here: the caller walks the path.
var errNoOpenat2 = errors.New("loader: openat2 unavailable")

// noOpenat2 is always true here (kept for the tests that force the walk).
var noOpenat2 atomic.Bool

// openat2Beneath is Linux only; elsewhere every open walks the path.
func openat2Beneath(int, string, int) (int, error) { return -1, errNoOpenat2 }
