package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/internal/yamlfile"
)

// dataPlaneEntry is one entry of the -dataplanes file: a data-plane
// token, the group it opens streams for and the tags it may ask for.
// The token is given by exactly one of TokenHash, TokenEnv and TokenFile.
type dataPlaneEntry struct {
	Group string   `json:"group"`
	Tags  []string `json:"tags"`
	// TokenHash is controlplane.HashToken of the token: "sha256:" and 64
	// hex digits. The file then holds no secret.
	TokenHash string `json:"token_hash"`
	// TokenEnv names an environment variable holding the token.
	TokenEnv string `json:"token_env"`
	// TokenFile is a file holding the token (one line; a trailing
	// newline is dropped), relative to the -dataplanes file's directory.
	TokenFile string `json:"token_file"`
}

// loadDataPlanes reads the -dataplanes file at path: a YAML list of
// entries (see dataPlaneEntry), decoded strictly (yamlfile: a wrong type
// or an unknown field is an error). Plaintext tokens (token_env,
// token_file) are hashed at once. The error wraps a yamlfile.Errors naming
// every problem with its line, column and field ([1].token_hash): a
// missing group or one that is not dataplane.ValidGroup, not exactly one of token_hash, token_env and
// token_file, a hash that is not "sha256:" and 64 hex digits, an empty or
// unset variable, an unreadable or empty token file, an empty tag, the
// same token twice, or no entry.
func loadDataPlanes(path string, getenv func(string) string) ([]controlplane.DataPlaneToken, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("dataplanes file: %w", err)
	}
	const none = "no data-plane tokens (want a list of entries with group, tags and token_hash, token_env or token_file)"
	f := &yamlfile.File{Name: path, Empty: none}
	var entries []dataPlaneEntry
	ok := f.Decode(data, &entries)
	if ok && len(f.Errs) == 0 && len(entries) == 0 {
		f.Report("", none, false, "")
	}
	if !ok {
		return nil, invalid(f.Err())
	}
	// On with the entries' checks whatever their shape: the problems of
	// an entry or field already refused are not said twice (Report).
	var out []controlplane.DataPlaneToken
	first := map[string]int{} // a hash's entry
	for i, e := range entries {
		at := fmt.Sprintf("[%d]", i)
		fail := func(field, format string, args ...any) { f.Report(at+field, fmt.Sprintf(format, args...), false, "") }
		if e.Group == "" {
			f.Report(at+".group", "missing", true, "")
		} else if !dataplane.ValidGroup(e.Group) {
			fail(".group", "%q: want %s", e.Group, dataplane.GroupRule)
		}
		for j, t := range e.Tags {
			if t == "" {
				fail(fmt.Sprintf(".tags[%d]", j), "empty")
			}
		}
		var hash string
		switch n := len(slices.DeleteFunc([]string{e.TokenHash, e.TokenEnv, e.TokenFile}, func(s string) bool { return s == "" })); {
		case n != 1:
			fail("", "give exactly one of token_hash, token_env and token_file")
		case e.TokenHash != "":
			h, ok := strings.CutPrefix(e.TokenHash, "sha256:")
			if b, err := hex.DecodeString(h); !ok || err != nil || len(b) != 32 {
				fail(".token_hash", "%q is not \"sha256:\" and 64 hex digits", e.TokenHash)
			} else {
				hash = "sha256:" + strings.ToLower(h)
			}
		case e.TokenEnv != "":
			if tok := getenv(e.TokenEnv); tok == "" {
				fail(".token_env", "the environment variable %s is unset or empty", e.TokenEnv)
			} else {
				hash = controlplane.HashToken(tok)
			}
		default:
			name := e.TokenFile
			if !filepath.IsAbs(name) {
				name = filepath.Join(filepath.Dir(path), name)
			}
			b, err := os.ReadFile(name)
			switch tok := strings.TrimRight(string(b), "\r\n"); {
			case err != nil:
				fail(".token_file", "%v", err)
			case tok == "":
				fail(".token_file", "%s is empty", name)
			default:
				hash = controlplane.HashToken(tok)
			}
		}
		if j, dup := first[hash]; dup && hash != "" {
			pl, _ := f.Place(fmt.Sprintf("[%d]", j))
			fail("", "the same token as [%d] (line %d); each token has one group and scope", j, pl.At.Line)
		} else if hash != "" {
			first[hash] = i
		}
		out = append(out, controlplane.DataPlaneToken{Hash: hash, Group: e.Group, Tags: e.Tags})
	}
	if err := f.Err(); err != nil {
		return nil, invalid(err)
	}
	return out, nil
}

// invalid is the error of a -dataplanes file with problems: a line of
// its own, then each problem on one, as the gateway says of its file.
func invalid(problems error) error {
	return fmt.Errorf("dataplanes file: invalid, not starting:\n%w", problems)
}
