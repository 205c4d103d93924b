// Package ctxutil holds the two small waits that several packages share:
// Sleep, a pause that ends early with its context, and Closed, a non-blocking
// test of a done channel.
//
// Inputs: a context and a duration, or a channel. Outputs: an error or a
// bool; nothing is retained. Ownership and concurrency: both are safe for
// concurrent use and never close or send on what they are given.
//
// It imports only the standard library, so every package of the module,
// proto included, may use it (internal/arch).
package ctxutil

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever comes first: nil after d,
// ctx.Err() when ctx ended first (also when it had ended before the call).
// d <= 0 returns at once, ctx.Err() if ctx has ended.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Closed reports whether ch is closed (or holds a value), without waiting.
// A nil channel is never closed.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
