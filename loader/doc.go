// Package loader reads image–caption datasets and hands out raw samples, a
// cheap index for planning, a deterministic epoch order, and a quarantine for
// bad samples.
//
// # Inputs
//
// Open(path, opts) detects the dataset kind from PATH (or Options.Format):
//
//   - a JSONL manifest (file ending in .jsonl, a folder holding
//     manifest.jsonl, or a glob of .jsonl files read one after the other):
//     one object per line, {"image": "rel/or/abs/path", "text": "caption",
//     "id": "optional"} ("caption" is accepted for "text"; "id" may be a
//     number); Options.ImageColumn, TextColumn and IDColumn rename the
//     fields (a dotted name reaches into nested objects). Blank lines are
//     skipped and not counted; a UTF-8 byte order mark at the start of the
//     file is skipped. Relative image paths resolve against
//     Options.Root (default: the manifest's folder) and may not leave it,
//     neither lexically ("..") nor through a symbolic link; such lines are
//     quarantined as "escapes_root". Absolute image paths are quarantined as
//     "escapes_root" unless Options.AllowAbsolute is set.
//   - WebDataset shards: a .tar file, a folder holding .tar files, or a glob
//     such as "data/shard-*.tar". Consecutive members with the same key (the
//     member path up to the first dot of its base name) form one sample: one
//     image (.jpg .jpeg .png .webp) and a caption (.txt, or .json with a
//     "caption" or "text" field, optionally "id"); Options.WDSImageKeys and
//     WDSTextKeys change these extensions and fields. A member whose name
//     repeats inside its group starts a new group with the same key, which
//     is quarantined as "duplicate_id" at location shard:key#2 (#3, ...).
//     Shards are read as streams
//     with archive/tar; gzip-compressed shards (.tar.gz, .tgz; concatenated
//     gzip members too) through compress/gzip, with the same grouping, and
//     offsets in the inflated tar (see wdsgz.go: Index re-reads them from
//     one inflated copy per shard under Options.SpoolDir, removed by
//     Index.Close). A brace pattern
//     "data-{000000..000099}.tar" or "{a,b}/s.tar" names a list of files
//     that must all exist.
//   - Parquet: a .parquet file, a folder or a glob of them. The image column
//     (default "image") is binary, large binary, or a struct with a "bytes"
//     field as HuggingFace datasets write it; the text column (default
//     "text") is a string. An optional id column (default "id") gives ids.
//     Files are read one row group at a time. A row group whose image or
//     text column claims more than Options.MaxRowGroupBytes (uncompressed,
//     from the footer) is quarantined as "too_large" before it is loaded;
//     an unreadable row group gets one "bad_parquet_row" reject (its
//     claimed row count is not trusted to size anything); a file that is
//     not Parquet, or lacks the columns or has the wrong types, is
//     quarantined as "bad_parquet_file" and the next file is read (when no
//     file has usable columns, the source fails with ErrSchema). Captions
//     over MaxCaptionBytes are "too_large". Input that makes the Parquet
//     library panic is recovered into ErrMalformedParquet.
//   - Parquet or Arrow image paths (imagepath.go): a row whose image
//     struct holds a "path" and null "bytes" (HuggingFace's to_parquet of an
//     Image column built from local files) names an image file, read under
//     the manifest's no-escape rules with Options.Root (default: the table
//     file's folder) as the root; an absolute path must lie below the root
//     once its links are resolved (Options.AllowAbsolute: opened as given).
//   - Arrow IPC (hfdisk.go, hfdisk_arrow.go): a .arrow file (a stream, as
//     HuggingFace datasets write them, or the IPC file format), a glob of
//     them, or a save_to_disk folder (state.json lists its data files, read
//     in that order; a DatasetDict folder, with dataset_dict.json, is refused
//     with its splits named). Columns as for Parquet; one record batch is
//     read at a time, its body bounded by Options.MaxRowGroupBytes (a larger
//     one, or one that cannot be read, quarantines the rest of its file with
//     one "too_large" or "bad_arrow_file" reject; a file without the columns
//     is one "bad_arrow_file", and ErrSchema when no file has them, naming
//     dataset_info.json's Image and string features). Each IPC message's
//     metadata is checked before the Arrow library reads it (hfdisk_ipc.go:
//     vector lengths, field nesting and count, variadic buffer counts, no
//     body compression, bodies within the file). Index re-reads a row
//     from its record batch's offset in the file. Location
//     file:b<batch>:row<row>; derived ids as for Parquet.
//   - an image folder: every image below the folder (recursively) with a
//     sidecar caption beside it (cat.jpg + cat.txt), or with a row in a
//     metadata.jsonl or metadata.csv of its folder or one above (the HF
//     imagefolder layout, folder_meta.go: file_name, the caption in
//     Options.TextColumn, other columns for Options.Keep). Linked
//     directories are not descended into; a linked image, caption or
//     metadata file is followed only when its target stays inside the
//     folder ("escapes_root" otherwise).
//
// Multi-file inputs are read in lexical path order.
//
// With Options.Remote set (see remote.go), PATH is an object key, a prefix or
// a brace pattern of keys on object storage, and only WebDataset shards are
// read: each shard is streamed from its first byte (members grouped as they
// arrive, image data of a scan read and dropped, nothing staged on disk), and
// Index re-reads an image with one ranged read of its size.
//
// # Hostile input
//
// Every source reads only regular files: a named pipe, device, socket or
// directory where an image, caption or dataset file is expected is
// quarantined as "not_regular_file" (or, for the dataset file itself, an
// error wrapping ErrNotRegular), and it is opened with O_NONBLOCK and
// checked on the open descriptor, so a FIFO never blocks a read and a file
// swapped for one after indexing fails at once. Every read is bounded (image
// and caption limits, also for files that grow) and long reads check the
// context between 1 MiB chunks. WebDataset member names that leave the
// archive ("../x.jpg", "/etc/x.jpg") are quarantined as "escapes_root", and
// a member cut short by the end of the shard as "broken_tar" while
// indexing. In a .tar.gz shard, a truncated or corrupt stream is a
// "broken_tar" of the sample it breaks (or of the shard, for a bad gzip
// header or trailer checksum, the samples before it being kept); members
// are checked against MaxImageBytes and MaxCaptionBytes before they are
// inflated into memory, and skipping inflated data checks the context, so a
// gzip bomb costs time that Ctrl-C ends, never memory.
//
// Files stay inside the dataset root at every open, not only at the scan
// (beneath.go): a manifest's or folder's images and captions are opened
// below the resolved root, and a shard or Parquet file below its own folder
// as resolved when the source listed it, with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_MAGICLINKS) (an fd-relative walk with O_NOFOLLOW, resolving
// links itself, where the kernel lacks openat2). A file or directory
// swapped after indexing for a link that leaves the root (or for an
// absolute link, wherever it points) fails with ErrEscapesRoot, and the
// sample is quarantined as "escapes_root"; links that stay inside are
// followed (links present at scan time are resolved then, absolute ones
// included). An absolute manifest path allowed by Options.AllowAbsolute is
// opened as given.
//
// # Sample ids
//
// A sample's ID is the id given by the dataset (manifest "id", WebDataset
// .json "id", Parquet id column) when non-empty. Otherwise it is derived:
//
//   - manifest: DeriveID(manifest base name, image field + "\n" + caption),
//     so duplicated lines give the same id (and Scan quarantines the copy as
//     "duplicate_id"), while one image with two captions gives two ids;
//   - WebDataset: the sample key (WebDataset keys are unique per dataset);
//   - Parquet: DeriveID(file base name, "row" + row number in the file);
//   - image folder: the image path relative to the folder, slash-separated.
//
// DeriveID(source, key) is the first 16 hex digits of SHA-1(source + "#" + key).
//
// # Outputs and ownership
//
// Source.Next returns samples whose Image bytes are owned by the caller. At
// the end Next returns io.EOF. Bad samples never stop a source: each becomes a
// Reject (see quarantine.go) passed to Options.OnReject, and Next moves on.
// Next returns another error only when the source itself fails (a manifest
// that cannot be opened or read, a Parquet file that cannot be opened) or the
// context is done.
//
// Scan(ctx, src) reads only cheap information (id, location, caption, image
// size) into an Index, without reading image bytes for manifest, WebDataset
// and folder sources; Index.ReadImage and Index.ReadHeader re-read bytes per
// entry later (WebDataset members by their offset in the uncompressed tar,
// so indexed WebDataset corpora can be shuffled globally). Planning never
// holds image bytes. Entries are read through accessors: Len, ID(i) and
// ImageSize(i) (no read), Entry(i), Entries(lo, hi) (a range, consecutive
// records in one read), All, and View (what a pipeline's Features keep).
//
// The index of a manifest, or of local uncompressed WebDataset shards, is
// packed (packed.go, packedtar.go): per entry it keeps the id (all ids end
// to end in one slice), the offset, length and a 16-bit checksum of its
// record (the manifest line; the shard's caption member), the line number
// or the text key the caption came from, the image size and offset, and
// the kept-fields row: 36 bytes plus the id for a manifest, 44 for a shard.
// Whenever an entry is materialised its record is re-read, so Text,
// Location, ImageName and the image reference are what the record says,
// byte for byte as Next gives them. A record that changed since indexing
// (checksum or id) materialises a stale entry, whose image reads fail with
// ErrStale (or with what reading its file failed with: ErrEscapesRoot for
// a file swapped for a link). The index holds its first 64 manifests open
// until Close, so a manifest removed or replaced after indexing still
// reads as indexed; shards open per read, as their images do. Other
// sources (Parquet, Arrow, folders, .tar.gz and remote shards, a mixture's
// combined index) keep their entries whole, their strings packed end to
// end in 64 KiB blocks (arena.go). Scan leaves no spare capacity
// (docs/BENCHMARKS.md, "Planner memory per sample").
//
// With Options.Keep (ParseKeep: "url,json:label,caption", see keep.go) Scan also keeps
// named source fields of each entry (the caption, keys of the manifest line or of a
// WebDataset .json member): Index.Kept(e) returns them, KeepTypes gives each field one type
// over the index, KeepMissing counts entries without it. A missing or malformed value is
// never a reject. The values are packed in the index's string blocks; Entry does not grow.
//
// Permutation(n, seed, epoch) gives the deterministic epoch order (see
// order.go for the exact algorithm, reproducible in Python).
//
// A Mixture (mixture.go; LoadMixture reads its YAML file) is a weighted
// mixture of datasets: CombineIndexes joins the sources' indexes into one
// (ids "<source>/<id>", each entry read by its own source), MixtureCounts
// gives each source's draws per epoch and MixtureOrder the epoch's draws,
// a pure function of (sizes, counts, seed, epoch) (mixture_order.go); a
// repeated draw's id is DrawID(id, repeat) (docs/mixtures.md).
//
// # Concurrency
//
// A Source is not safe for concurrent use; call Next from one goroutine.
// Index is immutable after Scan; its ReadImage, ReadHeader and Sample methods
// are safe for concurrent use. QuarantineWriter and Tally are safe for
// concurrent use. Options.OnReject is called from the goroutine calling Next
// or Scan. QuarantineFile (a quarantine.jsonl written once per sample across
// restarts) is safe for concurrent use.
//
// This package does not import NATS nor the image decoder: it delivers raw
// bytes; decoding and its rejects happen in a later stage, which reports them
// through the same QuarantineWriter.
package loader
