package loader

import (
	"encoding/json"
	"math"
	"path"
	"slices"
	"strings"
)

// tarRecord is what a WebDataset entry's record adds: where its image
// member's data is, its key, the image member's name after the key, and
// the text key its caption came from.
type tarRecord struct {
	imgOff  int64
	key     string
	suffix  string // the image member's base name after the key's (".jpg", ".seg.PNG")
	imgName string // ImageName, as the source gave it
	rank    int    // the text key (wdsKeys.texts) the caption came from
}

// packedTar holds the columns only WebDataset entries have: 8 bytes an
// entry, plus the keys that are not their entry's id and the image names
// that are not the key's base name and a suffix.
type packedTar struct {
	imgOff   []int64          // by entry (nil while there is none)
	keys     map[int32]string // entries whose key is not their id
	names    map[int32]string // entries whose ImageName is not derived from the key
	suffixes []string
	suffixAt map[string]uint32 // suffixes' positions, while building
}

// add keeps entry i's columns and returns its packedRec.aux: the text
// key's rank | the suffix's position << 8; ok false when they do not fit.
func (t *packedTar) add(i int, e Entry, r tarRecord) (uint32, bool) {
	if r.rank < 0 || r.rank > math.MaxUint8 {
		return 0, false
	}
	k, ok := t.suffixAt[r.suffix]
	if !ok {
		if len(t.suffixes) >= 1<<24 {
			return 0, false
		}
		if t.suffixAt == nil {
			t.suffixAt = map[string]uint32{}
		}
		k = uint32(len(t.suffixes))
		t.suffixes = append(t.suffixes, strings.Clone(r.suffix))
		t.suffixAt[t.suffixes[k]] = k
	}
	if len(t.imgOff) < i {
		t.imgOff = append(t.imgOff, make([]int64, i-len(t.imgOff))...)
	}
	t.imgOff = append(t.imgOff, r.imgOff)
	if r.key != e.ID {
		if t.keys == nil {
			t.keys = map[int32]string{}
		}
		t.keys[int32(i)] = strings.Clone(r.key)
	}
	if path.Base(r.key+r.suffix) != r.imgName {
		if t.names == nil {
			t.names = map[int32]string{}
		}
		t.names[int32(i)] = strings.Clone(r.imgName)
	}
	return uint32(r.rank) | k<<8, true
}

func (t *packedTar) done() {
	t.imgOff, t.suffixAt = slices.Clone(t.imgOff), nil
}

// entry materialises WebDataset entry i from its caption member's bytes.
func (t *packedTar) entry(i int, id string, r packedRec, rf *recordFile, rec []byte, err error) Entry {
	key := id
	if k, ok := t.keys[int32(i)]; ok {
		key = k
	}
	e := Entry{ID: id, Location: rf.loc + ":" + key, ImageSize: r.size}
	e.ref.keep = r.keep
	if err != nil {
		return stale(e, err)
	}
	text, ok := captionOf(rf.keys, int(r.aux&math.MaxUint8), rec)
	if !ok {
		return stale(e, errChanged)
	}
	e.Text = text
	if name, ok := t.names[int32(i)]; ok {
		e.ImageName = name
	} else {
		e.ImageName = path.Base(key + t.suffixes[r.aux>>8])
	}
	e.ref = imageRef{kind: refTar, root: rf.root, path: rf.path, off: t.imgOff[i], keep: r.keep}
	return e
}

// captionOf is the caption text key rank takes from a member's data, as
// tarGroup.addCaption took it.
func captionOf(keys wdsKeys, rank int, data []byte) (string, bool) {
	if rank >= len(keys.texts) {
		return "", false
	}
	k := keys.texts[rank]
	if k.field == "" {
		return string(data), true
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return "", false
	}
	var text string
	v := lookupPath(obj, k.field)
	if isNull(v) || json.Unmarshal(v, &text) != nil {
		return "", false
	}
	return text, true
}
