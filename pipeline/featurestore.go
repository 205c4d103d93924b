package pipeline

import (
	"image"
	"math"
	"unsafe"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
)

// featureStore keeps a dataset's per-index features (what the feature pass
// gave, for every epoch's orderFeatures) in columns of about 25 bytes per
// entry instead of an EntryFeatures (80 bytes, plus the id and format strings
// a cache or a worker's record decodes into strings of their own): the id is
// the index entry's, the format an index into a table, the counts and sizes
// int32. Rejects are kept whole, by index. Built by compactFeatures; read by
// at; immutable.
type featureStore struct {
	text, image []int32
	complexity  []float64
	w, h        []int32
	format      []uint8
	formats     []string // format[i] indexes it
	rejects     map[int]*loader.Reject
}

// compactFeatures stores all (the features of ix's entries, in index order)
// compactly, or returns ok false when they do not fit the columns (a count,
// a width or a height beyond int32, more than 256 formats, an id that is not
// its entry's): the caller keeps all then, and orderFeatures reports what it
// reported before.
func compactFeatures(ix *loader.Index, all []EntryFeatures) (*featureStore, bool) {
	if len(all) != ix.Len() {
		return nil, false
	}
	n := len(all)
	s := &featureStore{text: make([]int32, n), image: make([]int32, n), complexity: make([]float64, n),
		w: make([]int32, n), h: make([]int32, n), format: make([]uint8, n), rejects: map[int]*loader.Reject{}}
	formatIndex := map[string]uint8{}
	for i := range all {
		ef := &all[i]
		if ef.Reject != nil {
			s.rejects[i] = ef.Reject
			continue
		}
		it := ef.Item
		if it.ID != ix.ID(i) || !fitsInt32(it.TextTokens, it.ImageTokens, ef.Size.X, ef.Size.Y) {
			return nil, false
		}
		f, ok := formatIndex[ef.Format]
		if !ok {
			if len(s.formats) == math.MaxUint8+1 {
				return nil, false
			}
			f = uint8(len(s.formats))
			formatIndex[ef.Format] = f
			s.formats = append(s.formats, ef.Format)
		}
		s.text[i], s.image[i], s.complexity[i] = int32(it.TextTokens), int32(it.ImageTokens), it.Complexity
		s.w[i], s.h[i], s.format[i] = int32(ef.Size.X), int32(ef.Size.Y), f
	}
	return s, true
}

func fitsInt32(vs ...int) bool {
	for _, v := range vs {
		if v < math.MinInt32 || v > math.MaxInt32 {
			return false
		}
	}
	return true
}

// at returns entry i's features as the feature pass gave them, the id being
// the index entry's own string.
func (s *featureStore) at(ix *loader.Index, i int) EntryFeatures {
	if r := s.rejects[i]; r != nil {
		return EntryFeatures{Reject: r}
	}
	return EntryFeatures{
		Item: balancer.Item{ID: ix.ID(i), TextTokens: int(s.text[i]), ImageTokens: int(s.image[i]),
			Complexity: s.complexity[i]},
		Size:   image.Pt(int(s.w[i]), int(s.h[i])),
		Format: s.formats[s.format[i]],
	}
}

// bytes is the size of the columns (rejects not counted).
func (s *featureStore) bytes() int {
	return cap(s.text)*4 + cap(s.image)*4 + cap(s.complexity)*8 + cap(s.w)*4 + cap(s.h)*4 + cap(s.format) +
		len(s.formats)*int(unsafe.Sizeof(""))
}
