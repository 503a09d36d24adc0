package api

import "github.com/tetherfleet/tether/controlplane/agenthub"

// The agent hub lives in controlplane/agenthub; these names keep the
// composition root's and the tests' calls as they read.

// AgentHub tracks the agents connected to this replica.
type AgentHub = agenthub.Hub

// AgentHubConfig is what a hub is built with.
type AgentHubConfig = agenthub.Config

// NewAgentHub returns an idle hub; Run starts it.
func NewAgentHub(c AgentHubConfig) *AgentHub { return agenthub.New(c) }

// DefaultSweep bounds how late a task whose notification was lost reaches
// its stream.
const DefaultSweep = agenthub.DefaultSweep

// Hub is the part of these metrics the agent hub counts in.
func (m *Metrics) Hub() *agenthub.Metrics {
	return &agenthub.Metrics{ConnectedAgents: m.ConnectedAgents, Heartbeats: m.Heartbeats, HeartbeatWrites: m.HeartbeatWrites}
}
