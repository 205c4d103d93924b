package loader

import (
	"fmt"
	"slices"
	"strings"
)

// Default WebDataset keys: the member extensions that hold a sample's image,
// and those that hold its caption ("ext" for the whole member as text,
// "ext:field" for a field of a JSON member, a dotted path for nested ones).
const (
	DefaultWDSImageKeys = "jpg;jpeg;png;webp"
	DefaultWDSTextKeys  = "txt;json:caption;json:text"
)

// wdsKeys is the parsed form of Options.WDSImageKeys and WDSTextKeys.
type wdsKeys struct {
	images []string
	texts  []textKey // in priority order
}

type textKey struct{ ext, field string }

// parseWDSKeys parses "jpg;png" and "txt;json:caption" lists (lower-cased,
// without dots); "" takes the default.
func parseWDSKeys(images, texts string) (wdsKeys, error) {
	if images == "" {
		images = DefaultWDSImageKeys
	}
	if texts == "" {
		texts = DefaultWDSTextKeys
	}
	var k wdsKeys
	for _, e := range strings.Split(images, ";") {
		e = strings.ToLower(strings.TrimPrefix(strings.TrimSpace(e), "."))
		if e == "" || strings.Contains(e, ":") {
			return k, fmt.Errorf("%w: WebDataset image key %q in %q (want extensions like jpg;png)", ErrInvalidConfig, e, images)
		}
		k.images = append(k.images, e)
	}
	for _, t := range strings.Split(texts, ";") {
		ext, field, _ := strings.Cut(strings.TrimSpace(t), ":")
		ext = strings.ToLower(strings.TrimPrefix(ext, "."))
		if ext == "" || slices.Contains(k.images, ext) {
			return k, fmt.Errorf("%w: WebDataset text key %q in %q (want txt;json:caption, not an image key)", ErrInvalidConfig, t, texts)
		}
		k.texts = append(k.texts, textKey{ext, field})
	}
	return k, nil
}

func (k wdsKeys) image(ext string) bool { return slices.Contains(k.images, ext) }

func (k wdsKeys) text(ext string) bool {
	return slices.ContainsFunc(k.texts, func(t textKey) bool { return t.ext == ext })
}

// json reports whether members with ext are JSON (a key names a field of them).
func (k wdsKeys) json(ext string) bool {
	return slices.ContainsFunc(k.texts, func(t textKey) bool { return t.ext == ext && t.field != "" })
}

func (k wdsKeys) imageList() string { return "." + strings.Join(k.images, " .") }

func (k wdsKeys) textList() string {
	var parts []string
	for _, t := range k.texts {
		parts = append(parts, "."+t.ext+map[bool]string{true: "", false: ":" + t.field}[t.field == ""])
	}
	return strings.Join(parts, " ")
}
