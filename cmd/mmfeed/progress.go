package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressBar returns a progress callback that draws a bar with rate and ETA on w
// when w is a terminal, and nil otherwise (logs and pipes stay quiet). unit names
// what is counted ("steps", "samples"). Call it when the work starts: the rate
// counts from then.
func progressBar(w io.Writer, label, unit string) func(done, total int) {
	if !isTerminal(w) {
		return nil
	}
	return newProgress(w, label, unit, time.Now, 100*time.Millisecond)
}

// newProgress draws on any w. The rate is done over the time since newProgress
// was called, written beside the label: the bar's own rate counted from the
// bar's making, at the first callback with done already counted, so its first
// frame showed done over a microsecond (8,375,867 samples/s for 64 samples).
// Frames are drawn at most once per throttle; a frame's rate text may be one
// callback old.
func newProgress(w io.Writer, label, unit string, now func() time.Time, throttle time.Duration) func(done, total int) {
	start := now()
	var bar *progressbar.ProgressBar
	return func(done, total int) {
		if bar == nil {
			bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(label),
				progressbar.OptionShowCount(), progressbar.OptionSetPredictTime(false), progressbar.OptionThrottle(throttle),
				progressbar.OptionOnCompletion(func() { io.WriteString(w, "\n") }))
		}
		bar.Set(done)                                                       // draws, unless throttled
		bar.Describe(label + rateText(done, total, now().Sub(start), unit)) // draws too, unless throttled
	}
}

// rateText is " 320 samples/s, 1s left" for done of total in elapsed; empty
// before anything is done or when too little time has passed to tell.
func rateText(done, total int, elapsed time.Duration, unit string) string {
	if done <= 0 || elapsed < 10*time.Millisecond {
		return ""
	}
	rate := float64(done) / elapsed.Seconds()
	text := fmt.Sprintf(" %.0f %s/s", rate, unit)
	if rate < 10 {
		text = fmt.Sprintf(" %.1f %s/s", rate, unit)
	}
	if done < total {
		left := time.Duration(float64(total-done) / rate * float64(time.Second)).Round(time.Second)
		text += fmt.Sprintf(", %s left", left)
	}
	return text
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
