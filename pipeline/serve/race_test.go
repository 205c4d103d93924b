//go:build race

package serve

import (
	"golang.org/x/crypto/bcrypt"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
)

// Under the race detector bcrypt runs several times slower: the cheapest
// cost keeps a connect's password check under the server's first PING
// (natsauth.go, natsenv.PasswordHashCost). The hashes are still real bcrypt.
func init() { natsenv.PasswordHashCost = bcrypt.MinCost }
