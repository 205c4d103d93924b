package loader

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fuzzNames are the paths a FuzzFolderSource input can create.
var fuzzNames = []string{"a.jpg", "a.txt", "b.PNG", "b.txt", "sub/c.jpg", "sub/c.txt", "d.webp", "d.txt", "sub/e.jpeg", "e.txt",
	FolderMetadataJSONL, "sub/" + FolderMetadataCSV}

const fuzzSecret = "SECRET outside the dataset"

// buildFuzzFolder turns data into a folder: each entry is a kind byte (file,
// link inside, link outside, absolute link to /dev/zero, FIFO, directory),
// a name byte and a length-prefixed content.
func buildFuzzFolder(t *testing.T, data []byte) string {
	root := t.TempDir()
	dir := filepath.Join(root, "data")
	writeFile(t, filepath.Join(root, "secret.txt"), []byte(fuzzSecret))
	must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	for len(data) >= 3 {
		kind, name, n := data[0]%6, fuzzNames[int(data[1])%len(fuzzNames)], int(data[2])
		data = data[3:]
		content := data[:min(n, len(data))]
		data = data[len(content):]
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		switch kind {
		case 0:
			writeFile(t, p, content)
		case 1:
			_ = os.Symlink(fuzzNames[int(n)%len(fuzzNames)], p) // may dangle or loop
		case 2:
			_ = os.Symlink(filepath.Join(root, "secret.txt"), p)
		case 3:
			_ = os.Symlink("/dev/zero", p)
		case 4:
			_ = syscall.Mkfifo(p, 0o644)
		case 5:
			_ = os.Mkdir(p, 0o755)
		}
	}
	return dir
}

// FuzzFolderSource builds hostile folders (links in and out, pipes, devices,
// directories named like images, metadata files): the source never blocks, never reads
// outside the folder, never emits a bad sample and keeps its counters.
func FuzzFolderSource(f *testing.F) {
	f.Add([]byte{0, 0, 3, 'i', 'm', 'g', 0, 1, 2, 'h', 'i'})
	f.Add([]byte{0, 0, 1, 'x', 2, 1, 0, 4, 2, 0, 0, 3, 1, 3, 9, 0})
	f.Add([]byte{5, 0, 0, 0, 1, 4, 'c', 'a', 't', 's', 1, 2, 0})
	f.Add(append([]byte{0, 0, 1, 'x', 0, 10, 35}, `{"file_name":"a.jpg","text":"a"}`+"\nnot json\n"...))
	f.Add(append([]byte{0, 4, 1, 'x', 0, 11, 20}, "file_name,text\nc.jpg,c\n"...))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := buildFuzzFolder(t, data)
		src, err := Open(dir, Options{Format: FormatFolder, MaxCaptionBytes: 1 << 10})
		if err != nil {
			if !errors.Is(err, ErrNoData) {
				t.Fatalf("Open: %v", err)
			}
			return
		}
		defer src.Close()
		done := make(chan error, 1)
		n := 0
		go func() {
			for {
				s, err := src.Next(context.Background())
				if err != nil {
					done <- err
					return
				}
				if len(s.Image) == 0 || CheckCaption(s.Text) != "" || strings.Contains(s.Text, fuzzSecret) || strings.Contains(string(s.Image), fuzzSecret) {
					t.Errorf("emitted a bad or outside sample %+v", s)
				}
				n++
			}
		}()
		select {
		case err := <-done:
			if !errors.Is(err, io.EOF) {
				t.Fatalf("Next: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the folder source blocked")
		}
		st := src.Stats()
		if st.Seen != st.Emitted+st.Quarantined || st.Emitted != int64(n) {
			t.Errorf("stats %+v, emitted %d", st, n)
		}
	})
}
