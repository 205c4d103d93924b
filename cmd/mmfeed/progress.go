package main

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progressBar returns a progress callback that draws a bar with rate and ETA on w
// when w is a terminal, and nil otherwise (logs and pipes stay quiet). unit names
// what is counted ("steps", "samples").
func progressBar(w io.Writer, label, unit string) func(done, total int) {
	if !isTerminal(w) {
		return nil
	}
	var bar *progressbar.ProgressBar
	return func(done, total int) {
		if bar == nil {
			bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(label),
				progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString(unit),
				progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionOnCompletion(func() { io.WriteString(w, "\n") }))
		}
		bar.Set(done)
	}
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
