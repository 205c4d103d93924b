// Package browsertest runs a headless Chromium for tests, over the DevTools
// protocol (github.com/chromedp/chromedp): open a page, read its DOM after
// scripts ran, wait for a condition, save screenshots.
//
// Chromium is Debian's `chromium` package (`make test` installs it where it
// can, see the Makefile's deps target). Where no browser is found, New skips
// the test with a message that says so; with MMFEED_REQUIRE_BROWSER=1 it
// fails instead. MMFEED_CHROMIUM names the executable explicitly.
//
// Screenshots go to MMFEED_ARTIFACTS (a folder) when set, else to the test's
// temporary folder; Screenshot returns the path.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Browser is one headless Chromium tab.
type Browser struct {
	t   testing.TB
	ctx context.Context
}

// Find returns the Chromium executable: MMFEED_CHROMIUM, else the first of
// chromium, chromium-browser, google-chrome on PATH.
func Find() (string, error) {
	if p := os.Getenv("MMFEED_CHROMIUM"); p != "" {
		return exec.LookPath(p)
	}
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no chromium, chromium-browser or google-chrome on PATH (Debian: apt-get install chromium)")
}

// New starts a headless Chromium (a laptop-sized window, 1280×900) that lives
// until the test ends, or skips the test when there is none.
func New(t testing.TB) *Browser {
	t.Helper()
	path, err := Find()
	if err != nil {
		if os.Getenv("MMFEED_REQUIRE_BROWSER") == "1" {
			t.Fatalf("browser test: %v", err)
		}
		t.Skipf("browser test skipped: %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root in containers
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelC(); cancelA() })
	b := &Browser{t: t, ctx: ctx}
	// The first action starts the browser, which lives as long as that
	// action's context: it runs on ctx itself, not on a context with a timeout.
	if _, err := chromedp.Run(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("browser test: start %s: %v", path, err)
	}
	return b
}

// run runs one DevTools action with a timeout.
func run[T any](b *Browser, timeout time.Duration, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	return chromedp.Run(ctx, a)
}

// Open loads url and waits for its body.
func (b *Browser) Open(url string) {
	b.t.Helper()
	if _, err := run(b, 30*time.Second, chromedp.Navigate(url)); err != nil {
		b.t.Fatalf("open %s: %v", url, err)
	}
	if _, err := run(b, 30*time.Second, chromedp.WaitReady("body")); err != nil {
		b.t.Fatalf("open %s: %v", url, err)
	}
}

// DOM returns the document's serialised DOM as it is now (after scripts).
func (b *Browser) DOM() string {
	b.t.Helper()
	html, err := run(b, 10*time.Second, chromedp.OuterHTML("html"))
	if err != nil {
		b.t.Fatalf("read the DOM: %v", err)
	}
	return html
}

// EvalString evaluates a JavaScript expression that yields a string.
func (b *Browser) EvalString(expr string) string {
	b.t.Helper()
	v, err := run(b, 10*time.Second, chromedp.Evaluate[string](expr))
	if err != nil {
		b.t.Fatalf("evaluate %q: %v", expr, err)
	}
	return v
}

// URL returns the current location.
func (b *Browser) URL() string { return b.EvalString("location.href") }

// WaitDOM polls the DOM every 200 ms until ok accepts it or timeout passes,
// and returns the last DOM and whether ok accepted it.
func (b *Browser) WaitDOM(timeout time.Duration, ok func(dom string) bool) (string, bool) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		dom := b.DOM()
		if ok(dom) {
			return dom, true
		}
		if time.Now().After(deadline) {
			return dom, false
		}
		time.Sleep(200 * time.Millisecond) // polling a browser: there is nothing to wait on
	}
}

// Screenshot saves a full-page PNG named name (a file name, no folder) and
// returns its path.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	png, err := run(b, 30*time.Second, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("MMFEED_ARTIFACTS")
	if dir == "" {
		dir = b.t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(dir, strings.ReplaceAll(name, string(filepath.Separator), "_"))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
	return path
}
