package loader

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLinkHops bounds the symbolic links one walkBeneath follows (the
// kernel's own limit, 40, so both ways of opening agree).
const maxLinkHops = 40

// openIn opens path for reading the way openRegular does. With root "" the
// path is opened as given (an absolute path the user allowed, a spool file of
// the loader's own). Otherwise path, absolute or relative to root, must lie below root, and it is opened
// with openBeneath: no step of its resolution may leave root.
func openIn(root, path string) (*os.File, fs.FileInfo, error) {
	if root == "" {
		return openRegular(path)
	}
	rel, err := path, error(nil)
	if filepath.IsAbs(path) {
		rel, err = filepath.Rel(root, path)
	}
	if err != nil || !filepath.IsLocal(rel) {
		return nil, nil, fmt.Errorf("%s: %w (not below %s)", path, ErrEscapesRoot, root)
	}
	return openBeneath(root, rel)
}

// pinFile resolves, once, the symbolic links of a dataset file the user
// named (a WebDataset shard, a Parquet file) and returns the folder it lies
// in and its resolved path: every later open goes through openIn with them,
// so a file swapped afterwards for a link that leaves that folder is refused.
// A path that cannot be resolved is returned absolute, as given, so that the
// open says why.
func pinFile(p string) (root, path string) {
	path, err := filepath.Abs(p)
	if err != nil {
		path = p
	} else if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	return filepath.Dir(path), path
}

// openBeneath opens the file rel below the directory root for reading,
// resolved by the kernel so that no step leaves root: a ".." above root, an
// absolute symbolic link, or a link whose target lies outside root fails
// with ErrEscapesRoot, at the open that reads the bytes (a file swapped for
// such a link after indexing is refused, not read). Links that stay inside
// root are followed. It uses openat2(RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS)
// and, on kernels without openat2, walkBeneath. Like openRegular it never
// blocks on a FIFO and refuses what is not a regular file (ErrNotRegular).
func openBeneath(root, rel string) (*os.File, fs.FileInfo, error) {
	full := filepath.Join(root, rel)
	dir, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dir)
	const flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC
	fd, err := openat2Beneath(dir, rel, flags)
	if err == errNoOpenat2 {
		fd, err = walkBeneath(dir, rel, flags)
	}
	if err != nil {
		return nil, nil, beneathError(full, err)
	}
	return checkRegular(os.NewFile(uintptr(fd), full), full)
}

// beneathError turns an errno of openat2 or walkBeneath into an error that
// names the path; EXDEV (resolution left the root) wraps ErrEscapesRoot.
func beneathError(full string, err error) error {
	if err == unix.EXDEV {
		return fmt.Errorf("%s: %w", full, ErrEscapesRoot)
	}
	return &fs.PathError{Op: "open", Path: full, Err: err}
}

// checkRegular keeps f when it is a regular file (checked on the open
// descriptor), else closes it and fails with ErrNotRegular.
func checkRegular(f *os.File, p string) (*os.File, fs.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w (%s)", p, ErrNotRegular, kindOf(fi.Mode()))
	}
	return f, fi, nil
}

// walkBeneath opens rel below the directory descriptor root with flags,
// one component at a time with openat(O_NOFOLLOW), so that the kernel never
// follows a link by itself. A symbolic link is read with readlinkat and its
// target (relative; an absolute one is refused) is walked from the link's
// directory; ".." goes back up the directories walked and fails at root.
// Leaving root gives EXDEV, as openat2 with RESOLVE_BENEATH does; more than
// maxLinkHops links give ELOOP. It returns the descriptor of the file.
func walkBeneath(root int, rel string, flags int) (int, error) {
	w := beneathWalk{dirs: []int{root}, todo: splitPath(rel)}
	defer w.closeDirs()
	for len(w.todo) > 0 {
		c := w.todo[0]
		w.todo = w.todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(w.dirs) == 1 {
				return -1, unix.EXDEV
			}
			unix.Close(w.dirs[len(w.dirs)-1])
			w.dirs = w.dirs[:len(w.dirs)-1]
			continue
		}
		fd, err := w.step(c, flags)
		if err != nil || fd >= 0 {
			return fd, err
		}
	}
	return -1, unix.EISDIR // rel named root itself, or ended in a directory
}

// beneathWalk is the state of one walkBeneath: the directories walked
// (dirs[0], the root, is the caller's) and the components still to walk.
type beneathWalk struct {
	dirs []int
	todo []string
	hops int
}

// step walks one component c from the current directory. It returns the
// file's descriptor when c was the last component and a file, -1 when the
// walk goes on (a directory entered, a link's target queued).
func (w *beneathWalk) step(c string, flags int) (int, error) {
	cur := w.dirs[len(w.dirs)-1]
	last := len(w.todo) == 0
	want := walkDirFlags
	if last {
		want = flags
	}
	fd, err := unix.Openat(cur, c, want|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		if !last {
			w.dirs = append(w.dirs, fd)
			return -1, nil
		}
		return fd, nil
	}
	if err != unix.ELOOP && err != unix.ENOTDIR && err != unix.EMLINK {
		return -1, err
	}
	target, lerr := readlinkat(cur, c)
	if lerr != nil { // not a link: the open's own error stands
		return -1, err
	}
	if w.hops++; w.hops > maxLinkHops {
		return -1, unix.ELOOP
	}
	if strings.HasPrefix(target, "/") {
		return -1, unix.EXDEV
	}
	w.todo = append(splitPath(target), w.todo...)
	return -1, nil
}

func (w *beneathWalk) closeDirs() {
	for _, fd := range w.dirs[1:] {
		unix.Close(fd)
	}
}

// readlinkat reads the target of the link name in dir.
func readlinkat(dir int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= 1<<16 {
			return "", unix.ENAMETOOLONG
		}
		buf = make([]byte, 2*len(buf))
	}
}

// splitPath splits a slash-separated path into its components.
func splitPath(p string) []string { return strings.Split(p, "/") }
