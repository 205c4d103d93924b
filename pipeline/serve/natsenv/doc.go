// Package natsenv is the NATS environment of `mmfeed serve`: the embedded
// server, the service's connection, the job's credentials and TLS files,
// and the names of the JetStream assets they scope.
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
// # Ownership and concurrency
//
// The package holds no state of its own: the caller owns the server and
// the connection it returns and shuts them down. Every function is safe for
// concurrent use; PasswordHashCost is set only by tests, before they start.
// natsenv imports proto (subject and bucket names) and nothing else of
// this module; serve, bench and cmd import it (internal/arch).
package natsenv
