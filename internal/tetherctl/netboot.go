package tetherctl

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Event kind and reason the boot route records for an unknown machine
// (controlplane/events: NetbootMachineRefused, RefusedUnknownMAC); the CLI
// speaks only the API, so they are spelled out here.
const (
	kindNetbootRefused = "netboot.refused"
	reasonUnknownMAC   = "unknown_mac"
)

// SeenMAC is an unknown machine that asked to netboot.
type SeenMAC struct {
	MAC       string    `json:"mac"`
	LastSeen  time.Time `json:"last_seen"`
	FirstSeen time.Time `json:"first_seen"`
	Events    int       `json:"events"`
	Remote    string    `json:"remote"`
}

func (a *App) netbootCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "netboot", Short: "Machines that netboot from tetherd"}
	var limit int32
	seen := &cobra.Command{Use: "seen", Short: "List unknown hardware addresses that asked to netboot recently", Args: cobra.NoArgs,
		Long: "Reads the netboot.refused events (newest first, up to --events of them) and lists each unknown\n" +
			"hardware address once, leaving out addresses a node has since been given. Adopt a machine with\n" +
			"`tetherctl node create NAME --template T --mac MAC`.",
		RunE: func(*cobra.Command, []string) error {
			c, err := a.dial()
			if err != nil {
				return err
			}
			ctx, cancel := a.ctx()
			defer cancel()
			resp, err := c.ListEvents(ctx, &v1.ListEventsRequest{Kind: kindNetbootRefused, PageSize: limit})
			if err != nil {
				return err
			}
			owned := map[string]bool{}
			var page string
			for {
				ns, err := c.ListNodes(ctx, &v1.ListNodesRequest{PageSize: 1000, PageToken: page})
				if err != nil {
					return err
				}
				for _, n := range ns.Nodes {
					for _, m := range n.Macs {
						owned[m] = true
					}
				}
				if page = ns.NextPageToken; page == "" {
					break
				}
			}
			out := seenMACs(resp.Events, owned)
			if a.Output == "json" {
				b, err := json.Marshal(map[string]any{"machines": out})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(a.Stdout, string(b))
				return err
			}
			w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
			row(w, "MAC", "LAST SEEN", "FIRST SEEN", "EVENTS", "FROM")
			for _, s := range out {
				row(w, s.MAC, when(timestamppb.New(s.LastSeen)), when(timestamppb.New(s.FirstSeen)), s.Events, dash(s.Remote))
			}
			return w.Flush()
		}}
	seen.Flags().Int32Var(&limit, "events", 1000, "how many recent netboot.refused events to read")
	cmd.AddCommand(seen)
	return cmd
}

// seenMACs folds refusal events (newest first) into one row per unknown
// address that no node owns, most recently seen first.
func seenMACs(evs []*v1.FleetEvent, owned map[string]bool) []*SeenMAC {
	by := map[string]*SeenMAC{}
	var out []*SeenMAC
	for _, e := range evs {
		p := e.GetPayload().AsMap()
		mac, _ := p["mac"].(string)
		reason, _ := p["reason"].(string)
		if mac == "" || reason != reasonUnknownMAC || owned[mac] {
			continue
		}
		s := by[mac]
		if s == nil {
			remote, _ := p["remote"].(string)
			s = &SeenMAC{MAC: mac, LastSeen: e.CreatedAt.AsTime(), Remote: remote}
			by[mac] = s
			out = append(out, s)
		}
		s.FirstSeen = e.CreatedAt.AsTime()
		s.Events++
	}
	return out // events come newest first, so rows do too
}
