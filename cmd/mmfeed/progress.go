package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// progressBar returns a progress callback that draws a bar on w when w is a terminal,
// and nothing otherwise (logs and pipes stay quiet).
func progressBar(w io.Writer, label string) func(done, total int) {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return func(done, total int) {
		const width = 40
		n := width * done / max(1, total)
		fmt.Fprintf(w, "\r%s [%s%s] %d/%d steps", label, strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
		if done == total {
			fmt.Fprintln(w)
		}
	}
}
