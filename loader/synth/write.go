package synth

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// jsonlWriter writes images/ and manifest.jsonl.
type jsonlWriter struct {
	cfg   Config
	f     *os.File
	bw    *bufio.Writer
	files int
}

func newJSONLWriter(cfg Config) (*jsonlWriter, error) {
	if err := os.MkdirAll(filepath.Join(cfg.Out, "images"), 0o755); err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	f, err := os.Create(filepath.Join(cfg.Out, "manifest.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("synth: %w", err)
	}
	return &jsonlWriter{cfg: cfg, f: f, bw: bufio.NewWriterSize(f, 1<<20)}, nil
}

type manifestLine struct {
	ID    string `json:"id,omitempty"`
	Image string `json:"image"`
	Text  string `json:"text"`
}

func (w *jsonlWriter) write(it *item) error {
	rel := "images/" + it.fileName()
	if it.bad != BadMissingFile {
		if err := os.WriteFile(filepath.Join(w.cfg.Out, filepath.FromSlash(rel)), it.img, 0o644); err != nil {
			return fmt.Errorf("synth: %w", err)
		}
		w.files++
	}
	line := manifestLine{Image: rel, Text: it.text}
	if !w.cfg.OmitIDs {
		line.ID = it.id
	}
	b, err := json.Marshal(line)
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	w.bw.Write(b)
	return w.bw.WriteByte('\n')
}

func (w *jsonlWriter) close() (int, string, error) {
	err := errors.Join(w.bw.Flush(), w.f.Close())
	if err != nil {
		err = fmt.Errorf("synth: manifest: %w", err)
	}
	return w.files + 1, w.f.Name(), err
}

// tarWriter writes shard-NNNNNN.tar WebDataset shards.
type tarWriter struct {
	cfg    Config
	f      *os.File
	bw     *bufio.Writer
	tw     *tar.Writer
	n      int // samples in the open shard
	shards int
}

func newTarWriter(cfg Config) *tarWriter { return &tarWriter{cfg: cfg} }

// epoch is the fixed member time, so shards are byte-identical per seed.
var epoch = time.Unix(1_700_000_000, 0).UTC()

func (w *tarWriter) write(it *item) error {
	if w.tw == nil || w.n >= w.cfg.ShardSize {
		if err := w.rotate(); err != nil {
			return err
		}
	}
	w.n++
	if it.bad != BadMissingFile {
		if err := w.member(it.fileName(), it.img); err != nil {
			return err
		}
	}
	if it.asJSON {
		b, err := json.Marshal(map[string]string{"caption": it.text, "id": it.id})
		if err != nil {
			return fmt.Errorf("synth: %w", err)
		}
		return w.member(it.id+".json", b)
	}
	return w.member(it.id+".txt", []byte(it.text))
}

func (w *tarWriter) member(name string, data []byte) error {
	hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch,
		Typeflag: tar.TypeReg}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("synth: tar %s: %w", name, err)
	}
	if _, err := w.tw.Write(data); err != nil {
		return fmt.Errorf("synth: tar %s: %w", name, err)
	}
	return nil
}

func (w *tarWriter) rotate() error {
	if err := w.finishShard(); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(w.cfg.Out, fmt.Sprintf("shard-%06d.tar", w.shards)))
	if err != nil {
		return fmt.Errorf("synth: %w", err)
	}
	w.f, w.bw, w.n = f, bufio.NewWriterSize(f, 1<<20), 0
	w.tw = tar.NewWriter(w.bw)
	w.shards++
	return nil
}

func (w *tarWriter) finishShard() error {
	if w.tw == nil {
		return nil
	}
	err := errors.Join(w.tw.Close(), w.bw.Flush(), w.f.Close())
	w.tw = nil
	if err != nil {
		return fmt.Errorf("synth: shard: %w", err)
	}
	return nil
}

func (w *tarWriter) close() (int, string, error) {
	return w.shards, w.cfg.Out, w.finishShard()
}
