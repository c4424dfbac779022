package model

import "testing"

func TestParseTensorName(t *testing.T) {
	cases := []struct {
		name          string
		role          Role
		block, expert int
		module        string
	}{
		{"model.embed_tokens.weight", RoleEmbedding, -1, -1, "model.embed_tokens"},
		{"lm_head.weight", RoleClassifier, -1, -1, "lm_head"},
		{"model.norm.weight", RoleNorm, -1, -1, "model.norm"},
		{"model.layers.0.input_layernorm.weight", RoleNorm, 0, -1, "model.layers.0.input_layernorm"},
		{"model.layers.12.self_attn.q_proj.weight", RoleAttnQ, 12, -1, "model.layers.12.self_attn.q_proj"},
		{"model.layers.3.self_attn.k_proj.bias", RoleAttnK, 3, -1, "model.layers.3.self_attn.k_proj"},
		{"model.layers.3.self_attn.v_proj.weight", RoleAttnV, 3, -1, "model.layers.3.self_attn.v_proj"},
		{"model.layers.3.self_attn.o_proj.weight", RoleAttnO, 3, -1, "model.layers.3.self_attn.o_proj"},
		{"model.layers.3.self_attn.q_norm.weight", RoleNorm, 3, -1, "model.layers.3.self_attn.q_norm"},
		{"model.layers.5.mlp.gate_proj.weight", RoleMLPGate, 5, -1, "model.layers.5.mlp.gate_proj"},
		{"model.layers.5.mlp.up_proj.weight", RoleMLPUp, 5, -1, "model.layers.5.mlp.up_proj"},
		{"model.layers.5.mlp.down_proj.weight", RoleMLPDown, 5, -1, "model.layers.5.mlp.down_proj"},
		{"model.layers.1.block_sparse_moe.experts.7.w2.weight", RoleMLPDown, 1, 7, "model.layers.1.block_sparse_moe.experts.7.w2"},
		{"model.layers.1.block_sparse_moe.gate.weight", RoleRouter, 1, -1, "model.layers.1.block_sparse_moe.gate"},
		{"model.layers.1.mlp.gate.weight", RoleRouter, 1, -1, "model.layers.1.mlp.gate"},
		{"model.layers.1.mlp.experts.3.gate_proj.weight", RoleMLPGate, 1, 3, "model.layers.1.mlp.experts.3.gate_proj"},
		{"model.rotary_emb.inv_freq", RoleOther, -1, -1, "model.rotary_emb.inv_freq"},
	}
	for _, c := range cases {
		got := ParseTensorName(c.name)
		if got.Role != c.role || got.Block != c.block || got.Expert != c.expert || got.Module != c.module {
			t.Errorf("%s: got role %v block %d expert %d module %q; want %v %d %d %q",
				c.name, got.Role, got.Block, got.Expert, got.Module, c.role, c.block, c.expert, c.module)
		}
	}
	if !RoleMLPDown.IsLinear() || RoleNorm.IsLinear() || RoleClassifier.IsLinear() {
		t.Errorf("IsLinear wrong")
	}
}
