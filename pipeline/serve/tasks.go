package serve

import (
	"context"
	"sync"
)

// tasks owns the goroutines a Service starts on behalf of one message (a
// register that waits for a plan, a done that waits for acknowledgements, a
// resend, a fetch, a viewer fetch). Run opens it with its own context before
// the first handler is installed and closes it before it returns: every
// task gets a context that ends with Run (or when the task set is closed),
// Run waits for every task, and a task started after close does not run.
// Invariant: once closed, the WaitGroup only counts down.
type tasks struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	closed bool
	wg     sync.WaitGroup
}

// open gives the tasks a context derived from ctx. Called once, by Run.
func (t *tasks) open(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ctx, t.cancel = context.WithCancel(ctx)
}

// context is the tasks' context: it ends when Run ends. Before open (a
// handler called in a test without Run) it is already done.
func (t *tasks) context() context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return t.ctx
}

// start runs f on its own goroutine with the tasks' context and reports
// whether it did: false once the set is closed (or before it was opened).
func (t *tasks) start(f func(ctx context.Context)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.ctx == nil {
		return false
	}
	t.wg.Add(1)
	ctx := t.ctx
	go func() {
		defer t.wg.Done()
		f(ctx)
	}()
	return true
}

// close cancels the tasks' context, refuses new tasks and waits for the
// running ones.
func (t *tasks) close() {
	t.mu.Lock()
	t.closed = true
	if t.cancel != nil {
		t.cancel()
	}
	t.mu.Unlock()
	t.wg.Wait()
}
