// Key centering for the int8/fp8 KV cache: measures the key shift a quantized pool
// subtracts from every key row before rounding it (KvLayout::k_shift, backends/backend.h).
//
// Why: after RoPE, a layer's keys share a large common part - the channel biases of the
// rotary pairs that turn slowly over the positions in use - and the int8 step (max|x| /
// 127) or E4M3's 2^-4 relative rounding is paid on that common part by every key. Keys
// stored less a constant vector m per (layer, kv head) change every score of a query by
// the same q.m, which the softmax cancels, so only the remainder is rounded. (SageAttention
// smooths K the same way.) Values are stored unshifted: their mean would not cancel.
//
// m is a mean of the rotated keys over calibration text, taken from an unquantized pool
// the model fills itself (any backend, any RoPE variant). A rotary pair's mean depends on
// the positions it is taken over (it shrinks as the context passes the pair's period), so
// the text runs as sequences of kKvCalibLengths tokens, short to long; each sequence's
// keys are weighted by how many of its queries read them (n - p at position p), and the
// sequences count alike. Measured against shifts taken at one context length in
// bench/RESULTS.md (2026-12-06): on SmolLM2 this mix is as good at 256-token contexts as
// a 256-token calibration and keeps most of a 2048-token one's gain at 2048. Layers whose
// scores are soft-capped (Gemma 2) get a zero shift: the cap acts before the softmax.
// Tested in tests/runtime/kv_calibration_test.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model.h"

namespace kiln {

// Calibration sequence lengths in tokens (each capped by the model's positions; the text
// is consumed in order, and a sequence it cannot fill is shortened, or dropped under 16).
inline constexpr std::array<int32_t, 5> kKvCalibLengths = {128, 256, 512, 1024, 2048};

// Measures the key shift of every rank of `model` on model.kv_calib()'s text and stores it
// on each rank (Model::set_kv_key_shift). With kv_calib "none", or a model without a
// tokenizer (logged), it stores none. Throws kInvalidArgument for a calibration file that
// is missing or tokenizes to fewer than 16 tokens, or keys that are not finite.
void calibrate_kv_key_shift(Model& model);
// The same on these token ids (the text's, or a test's); `what` names them in the log.
// Throws kInvalidArgument for fewer than 16 tokens.
void calibrate_kv_key_shift(Model& model, const std::vector<int32_t>& tokens, const std::string& what);

// calibrate_kv_key_shift, once per model, for a model whose KV dtype is quantized
// (LlmRunner calls it before it allocates its pool); nothing for the auto cache.
void ensure_kv_key_shift(Model& model);

}  // namespace kiln
