package loader

import (
	"context"
	"errors"
	"io"
)

// openManifests opens one manifest, or a concatenation of several (a glob
// such as "data/*.jsonl"), read in the given order. Each manifest resolves
// image paths against its own folder.
func openManifests(paths []string, opts Options) (Source, error) {
	if len(paths) == 1 {
		return openManifest(paths[0], opts)
	}
	c := &concatSource{base: base{opts: opts}}
	for _, p := range paths {
		m, err := openManifest(p, opts)
		if err != nil {
			return nil, errors.Join(err, c.Close())
		}
		c.parts = append(c.parts, m)
	}
	return c, nil
}

// concatSource reads its parts one after the other. Counters are the sum of
// the parts'.
type concatSource struct {
	base
	parts []entryReader
	i     int
}

// Next implements Source.
func (c *concatSource) Next(ctx context.Context) (Sample, error) { return nextSample(ctx, c) }

func (c *concatSource) next(ctx context.Context, withImage bool) (Entry, []byte, error) {
	if c.closed {
		return Entry{}, nil, ErrClosed
	}
	for c.i < len(c.parts) {
		e, img, err := c.parts[c.i].next(ctx, withImage)
		if !errors.Is(err, io.EOF) {
			return e, img, err
		}
		c.i++
	}
	return Entry{}, nil, io.EOF
}

// packRecords implements recordSource when every part does.
func (c *concatSource) packRecords() {
	for _, p := range c.parts {
		if rs, ok := p.(recordSource); ok {
			rs.packRecords()
		}
	}
}

// lastRecord implements recordSource: the record of the part read last.
func (c *concatSource) lastRecord() (record, bool) {
	if rs, ok := c.parts[min(c.i, len(c.parts)-1)].(recordSource); ok {
		return rs.lastRecord()
	}
	return record{}, false
}

// Stats implements Source: the sum of the parts' counters.
func (c *concatSource) Stats() Stats {
	out := Stats{ByReason: map[string]int64{}}
	for _, p := range c.parts {
		s := p.Stats()
		out.Seen += s.Seen
		out.Emitted += s.Emitted
		out.Quarantined += s.Quarantined
		for r, n := range s.ByReason {
			out.ByReason[r] += n
		}
	}
	return out
}

// Close implements Source.
func (c *concatSource) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, p := range c.parts {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
