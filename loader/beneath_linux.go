package loader

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// walkDirFlags open a directory on the way down in walkBeneath: O_PATH
// needs only search permission, as path resolution does.
const walkDirFlags = unix.O_PATH | unix.O_DIRECTORY

// errNoOpenat2 says the kernel (or a seccomp filter) has no openat2: the
// caller walks the path itself.
var errNoOpenat2 = errors.New("loader: openat2 unavailable")

// noOpenat2 is set once openat2 failed with ENOSYS (or EPERM, what older
// container seccomp profiles answer for system calls they do not know), so
// later opens go straight to walkBeneath.
var noOpenat2 atomic.Bool

// openat2Beneath opens rel below the directory dir with openat2 and
// RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS; errNoOpenat2 where the system call
// is missing (Linux before 5.6, or filtered).
func openat2Beneath(dir int, rel string, flags int) (int, error) {
	if noOpenat2.Load() {
		return -1, errNoOpenat2
	}
	how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	var err error
	for range 8 { // EAGAIN: a concurrent rename under dir; the kernel asks to retry
		var fd int
		fd, err = unix.Openat2(dir, rel, &how)
		switch err {
		case nil:
			return fd, nil
		case unix.EINTR, unix.EAGAIN:
			continue
		case unix.ENOSYS, unix.EPERM:
			noOpenat2.Store(true)
			return -1, errNoOpenat2
		}
		return -1, err
	}
	return -1, err
}
