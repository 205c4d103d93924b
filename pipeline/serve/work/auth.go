package work

import (
	"context"
	"log/slog"
	"regexp"
	"sync"
	"time"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// WorkerInboxPrefix is the reply inbox prefix of a worker's own connection
// (natsenv.WorkerInboxPrefix).
const WorkerInboxPrefix = natsenv.WorkerInboxPrefix

// refusedFor is how long a worker remembers that the server refused it a
// subject (permissions can change on a server reload).
const refusedFor = time.Minute

// foreignNakDelay is how long an item of a job the worker's credential does
// not cover waits before it is delivered again, to any worker: long enough
// that the worker takes its own jobs' items meanwhile, short enough that a
// worker of that job soon gets it.
const foreignNakDelay = 500 * time.Millisecond

// refusals records the subjects the server refused a worker's connection
// (permission violations, which the server reports asynchronously).
type refusals struct {
	mu      sync.Mutex
	at      map[string]time.Time // subject: when refused
	changed chan struct{}        // closed and replaced on each refusal
}

var violationRe = regexp.MustCompile(`Permissions Violation for (?:Publish|Subscription) to "([^"]+)"`)

// handler is the connection's error handler: it records refused subjects
// and logs every asynchronous error.
func (r *refusals) handler(log *slog.Logger) nats.ErrHandler {
	return func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if m := violationRe.FindStringSubmatch(err.Error()); m != nil {
			r.mu.Lock()
			if r.at == nil {
				r.at = map[string]time.Time{}
			}
			r.at[m[1]] = time.Now()
			if r.changed != nil {
				close(r.changed)
			}
			r.changed = make(chan struct{})
			r.mu.Unlock()
			log.Debug("nats refused a subject", "subject", m[1])
			return
		}
		log.Warn("nats error", "err", err)
	}
}

// refusedLocked reports whether subj was refused within refusedFor and returns
// the channel closed at the next refusal. The caller holds r.mu.
func (r *refusals) refusedLocked(subj string) (bool, chan struct{}) {
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	t, ok := r.at[subj]
	return ok && time.Since(t) < refusedFor, r.changed
}

// watch returns a context that ends when ctx does or when the server
// refuses subj: a request on a refused subject fails at once instead of
// after its timeout (the server reports the refusal, not the request).
func (r *refusals) watch(ctx context.Context, subj string) (context.Context, context.CancelFunc) {
	wctx, cancel := context.WithCancel(ctx)
	go func() {
		for {
			r.mu.Lock()
			refused, next := r.refusedLocked(subj)
			r.mu.Unlock()
			if refused {
				cancel()
				return
			}
			select {
			case <-next:
			case <-wctx.Done():
				return
			}
		}
	}()
	return wctx, cancel
}

// job reports whether the server refused, within refusedFor, a subject the
// worker needs for job's items: its work bucket or its result subjects.
// Such a credential is another job's (natsenv.WorkerPermissions).
func (r *refusals) job(job string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, subj := range []string{workBucketInfo(job), ResultSubject(job), FeaturesSubject(job)} {
		if refused, _ := r.refusedLocked(subj); refused {
			return true
		}
	}
	return false
}

// workBucketInfo is the first subject a worker publishes for a job: the
// stream info request of its work bucket.
func workBucketInfo(job string) string { return "$JS.API.STREAM.INFO.OBJ_" + Bucket(job) }

// leaveRefused leaves an item of a job the worker's credential does not
// cover to another worker (a nak: it is never acknowledged or terminated,
// so it is not lost) and reports whether it did.
func (w *Worker) leaveRefused(m jetstream.Msg, job, id string) bool {
	if !w.refused.job(job) {
		return false
	}
	w.log.Debug("item of a job this worker's credential does not cover: left to other workers", "job", job, "item", id)
	_ = m.NakWithDelay(foreignNakDelay)
	return true
}
