package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/mmfeed/mmfeed/loader"
)

// readAttempts bounds how often one image read is tried before the sample is
// quarantined: a transient error (an NFS hiccup, EIO, a timeout) must not
// turn a good sample into a zero-weight row for good, and a broken disk must
// not stall the epoch.
const readAttempts = 3

// readBackoff is the wait before the second and later attempts.
var readBackoff = [readAttempts - 1]time.Duration{20 * time.Millisecond, 100 * time.Millisecond}

// permanent reports read errors that another attempt cannot fix: the file is
// gone, changed, not a regular file, outside the dataset root, too large, or
// the source cannot re-read.
func permanent(err error) bool {
	for _, e := range []error{fs.ErrNotExist, fs.ErrPermission, loader.ErrStale, loader.ErrNotRegular, loader.ErrEscapesRoot,
		loader.ErrTooLarge, loader.ErrNoImageRef, loader.ErrClosed, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// readWithRetry calls read up to readAttempts times while it fails with a
// transient error, waiting readBackoff between attempts (cancellable).
func readWithRetry(ctx context.Context, read func() ([]byte, error)) ([]byte, error) {
	var err error
	for attempt := range readAttempts {
		if attempt > 0 {
			select {
			case <-time.After(readBackoff[attempt-1]):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		var data []byte
		if data, err = read(); err == nil || permanent(err) {
			return data, err
		}
	}
	return nil, fmt.Errorf("%w (after %d attempts)", err, readAttempts)
}
