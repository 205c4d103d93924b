// Package natsenv is the NATS environment of `mmfeed serve`: the embedded
// server, the service's connection, the job's credentials and TLS files,
// the job's JetStream assets (their names and declarations), the job's
// leadership lease, and the fenced view of the state bucket that every
// state write of the service goes through.
//
// # Inputs and outputs
//
// A Config selects the deployment: the embedded server (a JetStream file
// store under DataDir, in-process only or listening on Listen, loading
// ServerConfig and the ServerTLS files) or external URLs with one
// authentication method and TLS. StartEmbedded starts the embedded server
// and returns once it accepts connections (or ctx ends); Connect opens the
// service's connection, in process to the embedded server (with the
// configured token, or as the service's own user when the configuration has
// users) or to the external URLs, reconnecting forever. ClientOptions gives
// a tool (`mmfeed inspect`) the same authentication. JobIdentities and
// AuthConfig write the identities of `mmfeed creds` (service, worker,
// viewer, one trainer per rank) as a server configuration with bcrypt
// hashes and the permissions of docs/security.md (TrainerPermissions,
// WorkerPermissions, ViewerPermissions); WriteTLS writes a private CA with
// one server and one client certificate. CheckReply says whether a request
// may be answered on its reply subject (the inbox prefixes of the
// identities: ServiceInboxPrefix, WorkerInboxPrefix, ViewerInboxPrefix),
// for serve's reply guard and the work planner alike.
//
// A non-loopback listener without authentication is refused (ErrInsecure)
// unless Security.Insecure; an invalid Config is ErrInvalidConfig. serve's
// sentinels of the same names are these values.
//
// Assets (assets.go) declares a job's JetStream assets: the state bucket,
// the quarantine bucket, the lease bucket and, on the JetStream data plane,
// the batch stream and one durable consumer per rank; each Ensure verb
// creates or updates one and returns it. serve calls them at setup and
// again to recreate a lost asset; when to check and what to write back
// into a recreated asset stay serve's (its asset watch).
//
// Lease (lease.go) is the job's leadership: OpenLease creates the lease
// bucket (LeaseBucket, key LeaseKey, entries that expire after the TTL);
// Acquire waits until this process holds the key, Hold renews it every
// TTL/4 until its context ends or the lease is lost (ErrLeaseLost), Check
// fails while the holder has not renewed for 3/4 of the TTL (fenced,
// ErrLeaseFenced) or after Release, Await waits out a fence, and Release
// deletes the key at the holder's revision so a standby takes over at
// once. Guard (guardkv.go) wraps the job's state bucket: every write
// passes a fence (the lease's Await) first, and its outcome a caller's
// stored hook; idempotent writes whose request was lost are sent again
// (kvAttempt). StorageCause names a failed write's storage cause on the
// embedded server (ErrStorageFull: its data directory full, or its
// JetStream turned off); IsKeyAnswer tells a key's answer (exists, not
// found, wrong revision) from a failed write.
//
// # Ownership and concurrency
//
// The caller owns the server and the connection natsenv returns and shuts
// them down; Assets and the functions hold nothing. The one state natsenv
// keeps is a Lease's: the key's last revision the server confirmed and when
// (Acquire writes them, then Hold alone; Release reads the revision once
// Hold has returned), and whether Release ran; Check and Await read only
// atomics and are safe for concurrent use. The lease's owner (serve's Run)
// holds it from Acquire to Release. A guarded bucket keeps no state beyond its
// fence and hook and is safe for concurrent use. natsenv never reads or
// writes the keys of the job's state bucket (what they hold is serve's): it
// only declares the bucket and fences the writes. PasswordHashCost and
// kvAttempt are set only by tests, before they start. natsenv imports
// proto (subject and bucket names, the stream's and consumers'
// declarations) and internal/ctxutil and nothing else of this module;
// serve, bench and cmd import it (internal/arch).
package natsenv
