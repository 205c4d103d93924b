package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// readChunk is how much one read call asks for before the context is checked
// again: a long read (a slow network file system, a huge member) stays
// cancellable.
const readChunk = 1 << 20

// openRegular opens p for reading without ever blocking on a named pipe or a
// device: it opens with O_NONBLOCK (which makes opening a FIFO return at
// once) and then checks, on the open descriptor, that p is a regular file, so
// a file swapped for a FIFO between a stat and the open is caught too. A
// non-regular file gives an error wrapping ErrNotRegular.
func openRegular(p string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	return checkRegular(f, p)
}

// kindOf names a non-regular file mode for quarantine details.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "irregular file"
}

// readFileBounded reads all of the regular file p, opened below root with
// openIn, failing with ErrTooLarge when it holds more than max bytes (checked
// on the open descriptor and again while reading, so a growing file cannot
// exceed it either).
func readFileBounded(ctx context.Context, root, p string, max int64) ([]byte, error) {
	f, fi, err := openIn(root, p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes > max %d: %w", p, fi.Size(), max, ErrTooLarge)
	}
	buf := make([]byte, fi.Size())
	if err := readFull(ctx, io.NewSectionReader(f, 0, fi.Size()), buf); err != nil {
		return nil, err
	}
	var one [1]byte
	if n, _ := f.ReadAt(one[:], fi.Size()); n > 0 {
		return nil, fmt.Errorf("%s: grew while read: %w", p, ErrStale)
	}
	return buf, nil
}

// readFull fills buf from r in chunks of readChunk, checking ctx between
// them. A short read gives io.ErrUnexpectedEOF.
func readFull(ctx context.Context, r io.Reader, buf []byte) error {
	for off := 0; off < len(buf); {
		if err := ctx.Err(); err != nil {
			return err
		}
		end := min(off+readChunk, len(buf))
		n, err := io.ReadFull(r, buf[off:end])
		off += n
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// within reports whether the resolved path real is root or below it (both
// with symbolic links resolved).
func within(realRoot, real string) bool {
	return real == realRoot || strings.HasPrefix(real, realRoot+string(filepath.Separator))
}

// resolveInside resolves the symbolic links of p and checks the result stays
// below realRoot. It returns the resolved path or a reject reason and detail.
func resolveInside(realRoot, p string) (string, string, string) {
	real, err := filepath.EvalSymlinks(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", ReasonMissingImage, "dangling link: " + err.Error()
	case err != nil:
		return "", ReasonUnreadableImage, err.Error()
	case !within(realRoot, real):
		return "", ReasonEscapesRoot, "link points outside the dataset folder: " + real
	}
	return real, "", ""
}
