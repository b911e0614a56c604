package cli

import (
	"encoding/json"
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion is what `idem version` reports, read from the binary's build information.
type buildVersion struct {
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Time     string `json:"time,omitempty"`
	Go       string `json:"go"`
}

// readVersion reads the module version and VCS stamp the Go toolchain embedded in the binary;
// "(devel)" is a build from a checkout (go run, go build), a version tag one from go install.
func readVersion() buildVersion {
	v := buildVersion{Version: "(unknown)"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Go = bi.GoVersion
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		case "vcs.time":
			v.Time = s.Value
		}
	}
	return v
}

func newVersionCmd(e *env) *cobra.Command {
	var jsonOut bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print idem's version, commit and Go version",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			v := readVersion()
			if jsonOut {
				enc := json.NewEncoder(e.stdout)
				return enc.Encode(v)
			}
			line := "idem " + v.Version
			if v.Revision != "" {
				line += " commit " + v.Revision
				if v.Modified {
					line += " (modified)"
				}
			}
			_, err := fmt.Fprintf(e.stdout, "%s %s\n", line, v.Go)
			return err
		},
	}
	cmd.Flags().BoolVar(&jsonOut, "json", false, "print JSON instead of a line")
	return cmd
}
