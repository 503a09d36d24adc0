package redfish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// The DMTF Redfish schema's names for the subset Tether drives: the
// service root, the Systems collection, a ComputerSystem, its Boot
// property and its ComputerSystem.Reset action.

// PowerState is ComputerSystem.PowerState.
type PowerState string

const (
	PowerOn         PowerState = "On"
	PowerOff        PowerState = "Off"
	PowerPoweringOn PowerState = "PoweringOn"
	// PowerPoweringOff is a shutdown under way.
	PowerPoweringOff PowerState = "PoweringOff"
	PowerPaused      PowerState = "Paused"
)

// ResetType is the ResetType parameter of ComputerSystem.Reset.
type ResetType string

const (
	ResetOn               ResetType = "On"
	ResetForceOff         ResetType = "ForceOff"
	ResetGracefulShutdown ResetType = "GracefulShutdown"
	ResetGracefulRestart  ResetType = "GracefulRestart"
	ResetForceRestart     ResetType = "ForceRestart"
	ResetPushPowerButton  ResetType = "PushPowerButton"
	ResetForceOn          ResetType = "ForceOn"
)

// Boot override values (Boot.BootSourceOverrideEnabled, ...Target, ...Mode).
const (
	OverrideOnce       = "Once"
	OverrideContinuous = "Continuous"
	OverrideDisabled   = "Disabled"
	TargetPxe          = "Pxe"
	ModeUEFI           = "UEFI"
	ModeLegacy         = "Legacy"
)

// Link is a navigation property.
type Link struct {
	ODataID string `json:"@odata.id"`
}

// ServiceRoot is /redfish/v1/.
type ServiceRoot struct {
	ODataID        string `json:"@odata.id"`
	RedfishVersion string `json:"RedfishVersion"`
	Systems        Link   `json:"Systems"`
}

// Collection is a resource collection (Systems).
type Collection struct {
	Members []Link `json:"Members"`
}

// Boot is ComputerSystem.Boot, as read.
type Boot struct {
	BootSourceOverrideEnabled string   `json:"BootSourceOverrideEnabled,omitempty"`
	BootSourceOverrideTarget  string   `json:"BootSourceOverrideTarget,omitempty"`
	BootSourceOverrideMode    string   `json:"BootSourceOverrideMode,omitempty"`
	AllowableTargets          []string `json:"BootSourceOverrideTarget@Redfish.AllowableValues,omitempty"`
}

// ResetAction is Actions."#ComputerSystem.Reset". A service lists the
// reset types it accepts inline (ResetType@Redfish.AllowableValues) or in
// an ActionInfo resource; one that says neither accepts the schema's set.
type ResetAction struct {
	Target     string      `json:"target"`
	Allowable  []ResetType `json:"ResetType@Redfish.AllowableValues,omitempty"`
	ActionInfo string      `json:"@Redfish.ActionInfo,omitempty"`
}

// Settings is @Redfish.Settings: a service that applies writes through a
// separate settings resource names it here, and PATCHes go there.
type Settings struct {
	SettingsObject Link `json:"SettingsObject"`
}

// System is a ComputerSystem.
type System struct {
	ODataID    string     `json:"@odata.id"`
	ODataETag  string     `json:"@odata.etag,omitempty"`
	ID         string     `json:"Id"`
	Name       string     `json:"Name"`
	PowerState PowerState `json:"PowerState"`
	Boot       Boot       `json:"Boot"`
	Actions    struct {
		Reset *ResetAction `json:"#ComputerSystem.Reset,omitempty"`
	} `json:"Actions"`
	Settings *Settings `json:"@Redfish.Settings,omitempty"`

	// etag is the ETag header of the GET that read this system.
	etag string
}

// ETag is the version to send in If-Match: the response header, or the
// @odata.etag property of services that only put it in the body.
func (s *System) ETag() string {
	if s.etag != "" {
		return s.etag
	}
	return s.ODataETag
}

// actionInfo is an ActionInfo resource.
type actionInfo struct {
	Parameters []struct {
		Name            string      `json:"Name"`
		AllowableValues []ResetType `json:"AllowableValues"`
	} `json:"Parameters"`
}

// BootPatch is the Boot property to PATCH; empty fields are left out.
type BootPatch struct {
	BootSourceOverrideEnabled string `json:"BootSourceOverrideEnabled,omitempty"`
	BootSourceOverrideTarget  string `json:"BootSourceOverrideTarget,omitempty"`
	BootSourceOverrideMode    string `json:"BootSourceOverrideMode,omitempty"`
}

// ServiceRootPath is the one path Redfish fixes; everything else is
// found from it by @odata.id links.
const ServiceRootPath = "/redfish/v1/"

// maxBody bounds what is read of a BMC's answer: a ComputerSystem is a
// few KiB; a BMC that sends more is not answering the question.
const maxBody = 1 << 20

// Client speaks Redfish to one BMC over HTTPS with basic auth.
type Client struct {
	base     *url.URL
	hc       *http.Client
	user     string
	password string
}

// NewClient returns a client for the service at base (scheme and host),
// authenticating every request with basic auth. hc carries the TLS policy.
func NewClient(base *url.URL, hc *http.Client, user, password string) *Client {
	return &Client{base: &url.URL{Scheme: base.Scheme, Host: base.Host}, hc: hc, user: user, password: password}
}

// HTTPError is a BMC's refusal: its status and the messages of its
// Redfish error body (error.@Message.ExtendedInfo[].Message, or
// error.message when it gives no extended info).
type HTTPError struct {
	Method, Path string
	Status       int
	Messages     []string
}

func (e *HTTPError) Error() string {
	msg := fmt.Sprintf("BMC answered %s %s with %d %s", e.Method, e.Path, e.Status, http.StatusText(e.Status))
	if len(e.Messages) > 0 {
		msg += ": " + strings.Join(e.Messages, "; ")
	}
	return msg
}

// SentError is a request that was sent but whose answer never came (a
// timeout, a cut connection): the BMC may or may not have acted.
type SentError struct {
	Method, Path string
	Err          error
}

func (e *SentError) Error() string {
	return fmt.Sprintf("%s %s: no answer from the BMC: %v", e.Method, e.Path, e.Err)
}

func (e *SentError) Unwrap() error { return e.Err }

// errorBody is the Redfish error response.
type errorBody struct {
	Error struct {
		Code         string `json:"code"`
		Message      string `json:"message"`
		ExtendedInfo []struct {
			MessageID string `json:"MessageId"`
			Message   string `json:"Message"`
		} `json:"@Message.ExtendedInfo"`
	} `json:"error"`
}

// parseError reads the BMC's own words out of an error body, if it sent one.
func parseError(b []byte) []string {
	var eb errorBody
	if json.Unmarshal(b, &eb) != nil {
		return nil
	}
	var out []string
	for _, m := range eb.Error.ExtendedInfo {
		if m.Message != "" {
			out = append(out, m.Message)
		}
	}
	if len(out) == 0 && eb.Error.Message != "" {
		out = append(out, eb.Error.Message)
	}
	return out
}

// resolve turns an @odata.id into a URL on the client's BMC. A link to
// another host is refused: the credentials go only where the node said.
func (c *Client) resolve(ref string) (*url.URL, error) {
	u, err := url.Parse(ref)
	if err != nil {
		return nil, fmt.Errorf("BMC link %q: %w", ref, err)
	}
	if u.Host != "" && u.Host != c.base.Host {
		return nil, fmt.Errorf("BMC link %q points to another host than %s", ref, c.base.Host)
	}
	if !strings.HasPrefix(u.Path, "/") {
		return nil, fmt.Errorf("BMC link %q is not an absolute path", ref)
	}
	return c.base.ResolveReference(&url.URL{Path: u.Path, RawQuery: u.RawQuery}), nil
}

// do sends one request and decodes a 2xx JSON answer into out (when
// non-nil). It returns the response headers.
func (c *Client) do(ctx context.Context, method, ref string, hdr http.Header, body, out any) (http.Header, error) {
	u, err := c.resolve(ref)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("%s %s: encode: %w", method, u.Path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, u.Path, err)
	}
	req.SetBasicAuth(c.user, c.password)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("OData-Version", "4.0")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		// url.Error's text holds the URL, which never holds credentials
		// here (they travel in the Authorization header).
		return nil, &SentError{Method: method, Path: u.Path, Err: unwrapURL(err)}
	}
	defer resp.Body.Close()
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.Header, &HTTPError{Method: method, Path: u.Path, Status: resp.StatusCode, Messages: parseError(b)}
	}
	if rerr != nil {
		return nil, &SentError{Method: method, Path: u.Path, Err: fmt.Errorf("read the answer: %w", rerr)}
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("%s %s: the BMC's answer is not the expected JSON: %w", method, u.Path, err)
		}
	}
	return resp.Header, nil
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// ServiceRoot reads /redfish/v1/.
func (c *Client) ServiceRoot(ctx context.Context) (*ServiceRoot, error) {
	var r ServiceRoot
	if _, err := c.do(ctx, http.MethodGet, ServiceRootPath, nil, nil, &r); err != nil {
		return nil, err
	}
	if r.Systems.ODataID == "" {
		return nil, errors.New("the BMC's service root has no Systems collection")
	}
	return &r, nil
}

// Systems lists the @odata.id of each member of the Systems collection
// the service root links to.
func (c *Client) Systems(ctx context.Context) ([]string, error) {
	root, err := c.ServiceRoot(ctx)
	if err != nil {
		return nil, err
	}
	var col Collection
	if _, err := c.do(ctx, http.MethodGet, root.Systems.ODataID, nil, nil, &col); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(col.Members))
	for _, m := range col.Members {
		if m.ODataID != "" {
			out = append(out, m.ODataID)
		}
	}
	return out, nil
}

// System reads one ComputerSystem by its @odata.id.
func (c *Client) System(ctx context.Context, ref string) (*System, error) {
	var s System
	h, err := c.do(ctx, http.MethodGet, ref, nil, nil, &s)
	if err != nil {
		return nil, err
	}
	s.etag = h.Get("ETag")
	if s.ODataID == "" {
		s.ODataID = ref
	}
	return &s, nil
}

// FindSystem walks from the service root to the member of the Systems
// collection whose @odata.id is path (trailing slashes aside), or to the
// only member when path is empty. The walk, not a built path, is what
// tells a wrong node address from a BMC that moved its systems.
func (c *Client) FindSystem(ctx context.Context, path string) (*System, error) {
	members, err := c.Systems(ctx)
	if err != nil {
		return nil, err
	}
	want := strings.TrimRight(path, "/")
	if want == "" {
		if len(members) != 1 {
			return nil, &HTTPError{Method: http.MethodGet, Path: "Systems", Status: http.StatusNotFound,
				Messages: []string{fmt.Sprintf("the BMC has %d systems (%s); name one in the node's BMC address", len(members), strings.Join(members, ", "))}}
		}
		return c.System(ctx, members[0])
	}
	for _, m := range members {
		if strings.TrimRight(m, "/") == want {
			return c.System(ctx, m)
		}
	}
	return nil, &HTTPError{Method: http.MethodGet, Path: path, Status: http.StatusNotFound,
		Messages: []string{fmt.Sprintf("no system %s in the BMC's Systems collection (it has %s)", path, strings.Join(members, ", "))}}
}

// ResetTypes is what the system's reset action accepts: the inline
// allowable values, else its ActionInfo's, else nil (not stated).
func (c *Client) ResetTypes(ctx context.Context, s *System) ([]ResetType, error) {
	a := s.Actions.Reset
	if a == nil {
		return nil, fmt.Errorf("system %s offers no #ComputerSystem.Reset action", s.ODataID)
	}
	if len(a.Allowable) > 0 {
		return a.Allowable, nil
	}
	if a.ActionInfo == "" {
		return nil, nil
	}
	var info actionInfo
	if _, err := c.do(ctx, http.MethodGet, a.ActionInfo, nil, nil, &info); err != nil {
		return nil, fmt.Errorf("read the reset action's ActionInfo: %w", err)
	}
	for _, p := range info.Parameters {
		if p.Name == "ResetType" {
			return p.AllowableValues, nil
		}
	}
	return nil, nil
}

// Allows reports whether t is among types; a service that states no
// allowable values is taken to accept the schema's whole set.
func Allows(types []ResetType, t ResetType) bool {
	return types == nil || slices.Contains(types, t)
}

// Reset posts ComputerSystem.Reset to the action's target.
func (c *Client) Reset(ctx context.Context, s *System, t ResetType) error {
	a := s.Actions.Reset
	if a == nil || a.Target == "" {
		return fmt.Errorf("system %s offers no #ComputerSystem.Reset target", s.ODataID)
	}
	_, err := c.do(ctx, http.MethodPost, a.Target, nil, map[string]ResetType{"ResetType": t}, nil)
	return err
}

// PatchBoot writes the Boot property: to the @Redfish.Settings object
// when the system names one, else to the system itself, with If-Match
// when the service gave an ETag. A 412 (the system changed since it was
// read) is answered by reading it again and retrying once.
func (c *Client) PatchBoot(ctx context.Context, s *System, b BootPatch) error {
	body := map[string]BootPatch{"Boot": b}
	for attempt := 0; ; attempt++ {
		ref := s.ODataID
		if s.Settings != nil && s.Settings.SettingsObject.ODataID != "" {
			ref = s.Settings.SettingsObject.ODataID
		}
		hdr := http.Header{}
		if et := s.ETag(); et != "" {
			hdr.Set("If-Match", et)
		}
		_, err := c.do(ctx, http.MethodPatch, ref, hdr, body, nil)
		var he *HTTPError
		if attempt == 0 && errors.As(err, &he) && he.Status == http.StatusPreconditionFailed {
			if s, err = c.System(ctx, s.ODataID); err != nil {
				return err
			}
			continue
		}
		return err
	}
}
