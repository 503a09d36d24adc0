package tetherctl

import (
	"encoding/json"
	"fmt"
	"slices"
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
	kindNetbootRefused   = "netboot.refused"
	reasonUnknownMAC     = "unknown_mac"
	kindNetbootAnnounced = "netboot.announced"
)

// SeenMAC is an unknown machine that asked to netboot.
type SeenMAC struct {
	MAC       string    `json:"mac"`
	LastSeen  time.Time `json:"last_seen"`
	FirstSeen time.Time `json:"first_seen"`
	Events    int       `json:"events"`
	Remote    string    `json:"remote"`
	// EKs are the TPM endorsement keys announced for the address, newest
	// first (tetherd serve --netboot-announce). More than one means more
	// than one sender claimed the address: compare with the console.
	EKs []SeenEK `json:"eks"`
}

// SeenEK is one endorsement key announced for an address.
type SeenEK struct {
	EK       string    `json:"ek"`
	LastSeen time.Time `json:"last_seen"`
	// Certificate: an EK certificate matching the key came with it, and
	// Issuer is who signed it (not checked against any maker's root).
	Certificate bool   `json:"ek_certificate"`
	Issuer      string `json:"ek_certificate_issuer,omitempty"`
	Remote      string `json:"remote"`
}

func (a *App) netbootCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "netboot", Short: "Machines that netboot from tetherd"}
	var limit int32
	seen := &cobra.Command{Use: "seen", Short: "List unknown hardware addresses that asked to netboot recently", Args: cobra.NoArgs,
		Long: "Reads the netboot.refused and netboot.announced events (newest first, up to --events of each) and lists\n" +
			"each unknown hardware address once, with the TPM endorsement keys announced for it, leaving out addresses\n" +
			"a node has since been given. Adopt a machine with `tetherctl node adopt MAC --ek HASH --template T`\n" +
			"(or, with no TPM, `tetherctl node create NAME --template T --mac MAC`).",
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
			announced, err := c.ListEvents(ctx, &v1.ListEventsRequest{Kind: kindNetbootAnnounced, PageSize: limit})
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
			out := seenMACs(resp.Events, announced.Events, owned)
			if a.Output == "json" {
				b, err := json.Marshal(map[string]any{"machines": out})
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(a.Stdout, string(b))
				return err
			}
			w := tabwriter.NewWriter(a.Stdout, 0, 4, 2, ' ', 0)
			row(w, "MAC", "TPM EK", "LAST SEEN", "FIRST SEEN", "EVENTS", "FROM")
			for _, s := range out {
				ek := "-"
				if len(s.EKs) > 0 {
					ek = s.EKs[0].EK
				}
				row(w, s.MAC, ek, when(timestamppb.New(s.LastSeen)), when(timestamppb.New(s.FirstSeen)), s.Events, dash(s.Remote))
				// Several keys for one address: someone else announced
				// it too. Each is listed; the console tells them apart.
				for _, e := range s.EKs[min(1, len(s.EKs)):] {
					row(w, "", e.EK+" (also announced)", when(timestamppb.New(e.LastSeen)), "", "", dash(e.Remote))
				}
			}
			return w.Flush()
		}}
	seen.Flags().Int32Var(&limit, "events", 1000, "how many recent netboot.refused events to read")
	cmd.AddCommand(seen)
	return cmd
}

// seenMACs folds refusal and announcement events (each newest first)
// into one row per unknown address that no node owns, most recently seen
// first, with the keys announced for it.
func seenMACs(refused, announced []*v1.FleetEvent, owned map[string]bool) []*SeenMAC {
	by := map[string]*SeenMAC{}
	var out []*SeenMAC
	get := func(mac, remote string, at time.Time) *SeenMAC {
		s := by[mac]
		if s == nil {
			s = &SeenMAC{MAC: mac, LastSeen: at, FirstSeen: at, Remote: remote, EKs: []SeenEK{}}
			by[mac] = s
			out = append(out, s)
		}
		if at.After(s.LastSeen) {
			s.LastSeen, s.Remote = at, remote
		}
		if at.Before(s.FirstSeen) {
			s.FirstSeen = at
		}
		s.Events++
		return s
	}
	for _, e := range refused {
		p := e.GetPayload().AsMap()
		mac, _ := p["mac"].(string)
		reason, _ := p["reason"].(string)
		if mac == "" || reason != reasonUnknownMAC || owned[mac] {
			continue
		}
		remote, _ := p["remote"].(string)
		get(mac, remote, e.CreatedAt.AsTime())
	}
	for _, e := range announced {
		p := e.GetPayload().AsMap()
		mac, _ := p["mac"].(string)
		ek, _ := p["ek"].(string)
		if mac == "" || ek == "" || owned[mac] {
			continue // a summary of a flood names no machine
		}
		remote, _ := p["remote"].(string)
		at := e.CreatedAt.AsTime()
		s := get(mac, remote, at)
		known := false
		for _, k := range s.EKs {
			known = known || k.EK == ek
		}
		if known {
			continue // newest first: the first seen is the latest
		}
		cert, _ := p["ek_certificate"].(bool)
		issuer, _ := p["ek_certificate_issuer"].(string)
		s.EKs = append(s.EKs, SeenEK{EK: ek, LastSeen: at, Certificate: cert, Issuer: issuer, Remote: remote})
	}
	slices.SortStableFunc(out, func(a, b *SeenMAC) int { return b.LastSeen.Compare(a.LastSeen) })
	return out
}
