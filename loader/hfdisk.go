package loader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A HuggingFace datasets save_to_disk folder holds state.json (which lists
// the data files, in order, under "_data_files"), dataset_info.json (the
// features) and the data files, Arrow IPC streams
// data-0000i-of-0000n.arrow. A DatasetDict saved the same way holds
// dataset_dict.json ({"splits": [...]}) and one such folder per split.

// HF save_to_disk file names.
const (
	HFStateFile   = "state.json"
	HFInfoFile    = "dataset_info.json"
	HFDictFile    = "dataset_dict.json"
	maxHFMetaFile = 16 << 20 // bound on state.json and dataset_info.json
)

// ReasonBadArrowFile: an Arrow file (or one of its record batches) could not
// be read, or lacks the columns; the rest of the file is skipped, one reject.
const ReasonBadArrowFile = "bad_arrow_file"

// hfState is the part of state.json the loader reads.
type hfState struct {
	DataFiles []struct {
		Filename string `json:"filename"`
	} `json:"_data_files"`
}

// parseHFState returns the data files state.json lists, relative to its
// folder. Each must be a plain local path ending in .arrow; at least one.
func parseHFState(data []byte) ([]string, error) {
	var st hfState
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUnknownFormat, HFStateFile, err)
	}
	if len(st.DataFiles) == 0 {
		return nil, fmt.Errorf("%w: %s lists no _data_files", ErrNoData, HFStateFile)
	}
	out := make([]string, 0, len(st.DataFiles))
	for _, f := range st.DataFiles {
		name := filepath.FromSlash(f.Filename)
		if !filepath.IsLocal(name) || !strings.HasSuffix(name, ".arrow") {
			return nil, fmt.Errorf("%w: %s names data file %q (want a relative .arrow path inside the folder)", ErrUnknownFormat, HFStateFile, f.Filename)
		}
		out = append(out, name)
	}
	return out, nil
}

// hfFeature is one feature of dataset_info.json: {"_type": "Image"} or
// {"_type": "Value", "dtype": "string"} (others are kept by name only).
type hfFeature struct {
	Type  string `json:"_type"`
	DType string `json:"dtype"`
}

// parseHFInfo returns the top-level Image features and string Value
// features of dataset_info.json, each sorted: the candidates an error names
// for --image-field and --text-field.
func parseHFInfo(data []byte) (images, texts []string, err error) {
	var info struct {
		Features map[string]json.RawMessage `json:"features"`
	}
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrUnknownFormat, HFInfoFile, err)
	}
	for name, raw := range info.Features {
		var f hfFeature
		if json.Unmarshal(raw, &f) != nil {
			continue // a list or a nested dict: neither an image nor a caption
		}
		switch {
		case f.Type == "Image":
			images = append(images, name)
		case f.Type == "Value" && (f.DType == "string" || f.DType == "large_string"):
			texts = append(texts, name)
		}
	}
	slices.Sort(images)
	slices.Sort(texts)
	return images, texts, nil
}

// detectHFDisk reports whether dir is a save_to_disk folder (it holds
// state.json) and returns its data files (absolute, in state.json's order).
// A DatasetDict folder fails with an error naming its splits.
func detectHFDisk(dir string) ([]string, bool, error) {
	if splits, ok := hfDictSplits(dir); ok {
		return nil, true, fmt.Errorf("%w: %s is a DatasetDict saved with save_to_disk: name one split folder, e.g. %s (splits: %s)",
			ErrUnknownFormat, dir, filepath.Join(dir, first(splits, "train")), strings.Join(splits, ", "))
	}
	if _, err := os.Lstat(filepath.Join(dir, HFStateFile)); errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	root, _ := pinDir(dir)
	state, err := readFileBounded(context.Background(), root, HFStateFile, maxHFMetaFile)
	if err != nil {
		return nil, true, fmt.Errorf("loader: open %s: %w", filepath.Join(dir, HFStateFile), err)
	}
	names, err := parseHFState(state)
	if err != nil {
		return nil, true, fmt.Errorf("loader: %s: %w", dir, err)
	}
	files := make([]string, 0, len(names))
	for _, n := range names {
		files = append(files, filepath.Join(root, n))
	}
	return files, true, nil
}

// hfDictSplits returns the splits dataset_dict.json in dir names.
func hfDictSplits(dir string) ([]string, bool) {
	root, _ := pinDir(dir)
	data, err := readFileBounded(context.Background(), root, HFDictFile, maxHFMetaFile)
	if err != nil {
		return nil, false
	}
	var dd struct {
		Splits []string `json:"splits"`
	}
	_ = json.Unmarshal(data, &dd)
	return dd.Splits, true
}

// pinDir is dir absolute with its links resolved (as given when it cannot
// be resolved, so that the open says why).
func pinDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir, err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return abs, err
	}
	return real, nil
}

func first(s []string, def string) string {
	if len(s) > 0 && filepath.IsLocal(s[0]) {
		return s[0]
	}
	return def
}

// hfColumnHint names the columns the dataset_info.json beside files (a
// save_to_disk folder's) offers, for an error about missing columns ("" when
// there is none).
func hfColumnHint(files []string) string {
	if len(files) == 0 {
		return ""
	}
	root, _ := pinDir(filepath.Dir(files[0]))
	info, err := readFileBounded(context.Background(), root, HFInfoFile, maxHFMetaFile)
	if err != nil {
		return ""
	}
	images, texts, err := parseHFInfo(info)
	if err != nil || len(images)+len(texts) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s has Image features %v and string features %v: pass them as --image-field and --text-field", HFInfoFile, images, texts)
}
