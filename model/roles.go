package model

import (
	"regexp"
	"strconv"
	"strings"
)

// Role is what a tensor does in a decoder-only transformer; the converter and the allocator
// decide what to quantize, and how, from it.
type Role int

const (
	RoleOther Role = iota
	RoleEmbedding
	RoleAttnQ
	RoleAttnK
	RoleAttnV
	RoleAttnO
	RoleMLPGate
	RoleMLPUp
	RoleMLPDown
	RoleNorm
	RoleClassifier
	RoleRouter
	RoleConv
)

var roleNames = [...]string{"other", "embedding", "attn_q", "attn_k", "attn_v", "attn_o",
	"mlp_gate", "mlp_up", "mlp_down", "norm", "classifier", "router", "conv"}

func (r Role) String() string {
	if int(r) < len(roleNames) {
		return roleNames[r]
	}
	return "role(" + strconv.Itoa(int(r)) + ")"
}

// IsLinear reports whether the role is a linear projection inside a decoder block, the
// tensors that weight-only quantization targets.
func (r Role) IsLinear() bool { return r >= RoleAttnQ && r <= RoleMLPDown }

// TensorName is a parsed tensor name: its role, decoder block and the module it belongs to.
type TensorName struct {
	Name   string
	Role   Role
	Block  int    // decoder block index, −1 outside the blocks
	Expert int    // MoE expert index, −1 when not an expert weight
	Module string // the name without ".weight"/".bias", e.g. "model.layers.0.self_attn.q_proj"
	Param  string // "weight", "bias" or the last component for other tensors
}

var blockRe = regexp.MustCompile(`(?:^|\.)(?:layers|h|blocks|block|decoder\.layers)\.(\d+)\.`)
var expertRe = regexp.MustCompile(`\.experts\.(\d+)\.`)

// The last module component (before .weight/.bias) → role, for the families qpack knows
// (Llama, Mistral, Qwen2/3 and Mixtral/Qwen-MoE style experts).
var moduleRoles = map[string]Role{
	"q_proj": RoleAttnQ, "k_proj": RoleAttnK, "v_proj": RoleAttnV, "o_proj": RoleAttnO,
	"gate_proj": RoleMLPGate, "up_proj": RoleMLPUp, "down_proj": RoleMLPDown,
	"w1": RoleMLPGate, "w3": RoleMLPUp, "w2": RoleMLPDown, // Mixtral experts
	"input_layernorm": RoleNorm, "post_attention_layernorm": RoleNorm, "norm": RoleNorm,
	"q_norm": RoleNorm, "k_norm": RoleNorm, "pre_feedforward_layernorm": RoleNorm,
	"post_feedforward_layernorm": RoleNorm,
	"embed_tokens":               RoleEmbedding, "wte": RoleEmbedding, "lm_head": RoleClassifier,
}

// ParseTensorName classifies a checkpoint tensor name.
func ParseTensorName(name string) TensorName {
	t := TensorName{Name: name, Block: -1, Expert: -1, Module: name}
	if m := blockRe.FindStringSubmatch(name); m != nil {
		t.Block, _ = strconv.Atoi(m[1])
	}
	if m := expertRe.FindStringSubmatch(name); m != nil {
		t.Expert, _ = strconv.Atoi(m[1])
	}
	module, param := name, ""
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		module, param = name[:i], name[i+1:]
	}
	t.Param = param
	if param == "weight" || param == "bias" {
		t.Module = module
	}
	last := t.Module[strings.LastIndexByte(t.Module, '.')+1:]
	switch {
	case strings.HasSuffix(t.Module, "mlp.gate") || strings.HasSuffix(t.Module, "block_sparse_moe.gate") ||
		last == "router":
		t.Role = RoleRouter
	case strings.Contains(last, "norm"):
		t.Role = RoleNorm
	case strings.Contains(last, "conv"):
		t.Role = RoleConv
	default:
		t.Role = moduleRoles[last]
	}
	return t
}
