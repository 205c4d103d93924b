package proto

import (
	"context"
	"testing"
	"time"
)

// TestPublishCanceledSettles cancels Publish at different points while its
// chunks are in flight: when it returns, every chunk it sent is stored or
// refused, so nothing of the canceled batch reaches the stream later. (A
// rewind purges a rank's subject right after canceling its publisher; a late
// chunk of the old generation would then sit before the replayed steps.)
func TestPublishCanceledSettles(t *testing.T) {
	tr := newTransport(t, 0, nil)
	tr.pub.chunkSize = 1024
	meta := testMeta(ModalityVision, DTypeUint8, []int{3, 32, 32})
	payload := mustEncode(t, meta, testRows(meta, 32)) // about 100 chunks
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Duration(i*100)*time.Microsecond, cancel)
		meta.Step = i
		_, _ = tr.pub.Publish(ctx, meta.Key(), 0, payload)
		cancel()
		stored := streamMsgs(t, tr.st)
		// Nothing may arrive after Publish returned: give a late chunk the
		// time it would need to land, then count again.
		time.Sleep(20 * time.Millisecond)
		if late := streamMsgs(t, tr.st); late != stored {
			t.Fatalf("publish %d: %d chunks stored when Publish returned, %d after it", i, stored, late)
		}
	}
}
