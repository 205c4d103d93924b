package loader

import (
	"errors"
	"fmt"
	"math"
)

// MixtureIndex is the index of a mixture: one Index whose entries are the
// sources' entries in source order, each id prefixed with its source's name
// and "/" (so ids stay unique across sources), and the position of each
// source's first entry.
type MixtureIndex struct {
	*Index
	// Names are the sources' names, in source order.
	Names []string
	// Offsets[i] is the position of source i's first entry in Entries;
	// Offsets[len(Names)] == len(Entries).
	Offsets []int
}

// Size is the number of good entries of source i.
func (m *MixtureIndex) Size(i int) int { return m.Offsets[i+1] - m.Offsets[i] }

// SourceOf returns the source of entry position pos.
func (m *MixtureIndex) SourceOf(pos int) int {
	lo, hi := 0, len(m.Names)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if m.Offsets[mid] <= pos {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Positions maps the draws of an epoch (MixtureOrder over the sources'
// Size) to entry positions and repeats; repeats is nil when no draw is a
// repetition.
func (m *MixtureIndex) Positions(draws []Draw) (pos []int, repeats []int32) {
	pos = make([]int, len(draws))
	for i, d := range draws {
		pos[i] = m.Offsets[d.Source] + int(d.Sample)
		if d.Repeat > 0 {
			if repeats == nil {
				repeats = make([]int32, len(draws))
			}
			repeats[i] = d.Repeat
		}
	}
	return pos, repeats
}

// CombineIndexes builds the index of a mixture from its sources' indexes
// (parts, in source order, named by names). The result owns the parts: its
// Close closes them, and their Entries are released. An entry whose id has
// the form of a repetition of another entry of its source (DrawID: "x#2"
// beside "x") is quarantined as "duplicate_id" through onReject (nil:
// counted only), so every draw id of an epoch stays unique.
func CombineIndexes(names []string, parts []*Index, onReject func(Reject)) (*MixtureIndex, error) {
	if len(names) != len(parts) || len(parts) == 0 || len(parts) > math.MaxUint16 {
		return nil, fmt.Errorf("%w: %d names for %d indexes", ErrInvalidMixture, len(names), len(parts))
	}
	total := 0
	for _, p := range parts {
		total += p.Len()
	}
	m := &MixtureIndex{Index: &Index{opts: parts[0].opts, parts: parts, Stats: Stats{ByReason: map[string]int64{}}},
		Names: names, Offsets: make([]int, 0, len(parts)+1)}
	m.entries = make([]Entry, 0, total)
	for i, p := range parts {
		m.Offsets = append(m.Offsets, len(m.entries))
		ids := make(map[string]struct{}, p.Len())
		for j := range p.Len() {
			ids[p.ID(j)] = struct{}{}
		}
		var t Tally
		for _, e := range p.All() {
			e.ID = names[i] + "/" + e.ID
			if base, _, ok := DrawBase(e.ID); ok {
				if _, clash := ids[base[len(names[i])+1:]]; clash {
					t.Quarantine(ReasonDuplicateID)
					if onReject != nil {
						onReject(Reject{ID: e.ID, Location: e.Location, Reason: ReasonDuplicateID,
							Detail: "the same id as a repeated draw of " + base})
					}
					continue
				}
			}
			e.ref.part = uint16(i)
			m.entries = append(m.entries, m.strs.entry(e))
		}
		m.addStats(p.Stats, t.Stats())
		p.release()
	}
	m.Offsets = append(m.Offsets, len(m.entries))
	return m, nil
}

// addStats adds a part's scan counters and the combining's rejects.
func (m *MixtureIndex) addStats(part, combined Stats) {
	m.Stats.Seen += part.Seen
	m.Stats.Emitted += part.Emitted - combined.Quarantined
	m.Stats.Quarantined += part.Quarantined + combined.Quarantined
	for r, n := range part.ByReason {
		m.Stats.ByReason[r] += n
	}
	for r, n := range combined.ByReason {
		m.Stats.ByReason[r] += n
	}
}

func closeParts(parts []*Index) error {
	var errs []error
	for _, p := range parts {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
