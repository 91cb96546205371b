"""``GenerationTesterMixin`` for transformers' ``ModelTesterMixin`` (its ``tests/generation/
test_utils.py`` is not in the release's source distribution): hf-mecheval's own equivalents of
its tests that apply to a causal LM with a recurrent cache, each over the tester's inputs and every
generative class. Not here, because they do not apply: contrastive search and DoLa (removed from
transformers 5), static / offloaded / quantised key-value caches and ``torch.compile`` of a
compileable cache (the cache is a recurrent state, not key/value tensors), cache cropping
(``is_croppable`` False); assisted and prompt-lookup decoding are checked to be refused.
``test_past_key_values_format`` reads the cache a forward returns as transformers' test does, each
layer by its kind; the test case says what it expects of each (``_expected_cache``)."""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, LinearAttentionCacheLayerMixin


class GenerationTesterMixin:
    max_new_tokens = 3

    def _generative_inputs(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        return config, inputs["input_ids"], inputs.get("attention_mask")

    def _models(self, config):
        for model_class in self.all_generative_model_classes:
            torch.manual_seed(0)
            yield model_class(config).eval()

    def _greedy(self, model, input_ids, attention_mask, **kwargs):
        return model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=self.max_new_tokens,
                              do_sample=False, pad_token_id=model.config.pad_token_id, eos_token_id=None,
                              **kwargs)

    def test_greedy_generate_equals_greedy_without_the_cache(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            cached = self._greedy(model, input_ids, attention_mask, use_cache=True)
            uncached = self._greedy(model, input_ids, attention_mask, use_cache=False)
            self.assertEqual(cached.shape, (input_ids.shape[0], input_ids.shape[1] + self.max_new_tokens))
            self.assertTrue(torch.equal(cached, uncached))

    def test_greedy_generate_dict_outputs(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            out = self._greedy(model, input_ids, attention_mask, return_dict_in_generate=True, output_scores=True,
                               output_logits=True, output_hidden_states=True, output_attentions=True)
            B, L, n = input_ids.shape[0], input_ids.shape[1], self.max_new_tokens
            self.assertEqual(out.sequences.shape, (B, L + n))
            self.assertEqual([s.shape for s in out.scores], [(B, config.vocab_size)] * n)
            self.assertEqual([s.shape for s in out.logits], [(B, config.vocab_size)] * n)
            # the prompt's hidden states, then one position per new token, every layer and the embeddings
            self.assertEqual(len(out.hidden_states), n)
            for step, states in enumerate(out.hidden_states):
                self.assertEqual(len(states), config.num_hidden_layers + 1)
                self.assertEqual({h.shape for h in states}, {(B, L if step == 0 else 1, config.hidden_size)})
            # the greedy pick is the argmax of each step's logits
            picked = torch.stack([s.argmax(-1) for s in out.logits], dim=1)
            self.assertTrue(torch.equal(picked, out.sequences[:, L:]))

    def test_sample_generate_is_reproducible_with_a_seed(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            runs = []
            for _ in range(2):
                torch.manual_seed(7)
                runs.append(model.generate(input_ids, attention_mask=attention_mask, do_sample=True, top_k=0,
                                           max_new_tokens=self.max_new_tokens, eos_token_id=None,
                                           pad_token_id=config.pad_token_id))
            self.assertTrue(torch.equal(*runs))
            self.assertTrue(bool((runs[0] < config.vocab_size).all()))

    def test_beam_search_generate_equals_beam_search_without_the_cache(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            kwargs = dict(num_beams=2, num_return_sequences=2, max_new_tokens=self.max_new_tokens,
                          eos_token_id=None, pad_token_id=config.pad_token_id, do_sample=False)
            cached = model.generate(input_ids, attention_mask=attention_mask, use_cache=True, **kwargs)
            uncached = model.generate(input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
            self.assertEqual(cached.shape[0], 2 * input_ids.shape[0])
            self.assertTrue(torch.equal(cached, uncached))

    def test_left_padding_compatibility(self):
        config, input_ids, _ = self._generative_inputs()
        for model in self._models(config):
            pad = torch.full((input_ids.shape[0], 3), config.pad_token_id, dtype=input_ids.dtype)
            padded = torch.cat([pad, input_ids], dim=1)
            mask = torch.cat([torch.zeros_like(pad), torch.ones_like(input_ids)], dim=1)
            with torch.no_grad():
                plain = model(input_ids).logits[:, -1]
                left = model(padded, attention_mask=mask).logits[:, -1]
            torch.testing.assert_close(left, plain, rtol=1e-4, atol=1e-5)

    def test_generate_continues_from_a_returned_cache(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            whole = self._greedy(model, input_ids, attention_mask, return_dict_in_generate=True)
            self.max_new_tokens, n = 1, self.max_new_tokens
            try:
                first = self._greedy(model, input_ids, attention_mask, return_dict_in_generate=True)
                self.max_new_tokens = n - 1
                mask = None if attention_mask is None else torch.cat(
                    [attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
                rest = self._greedy(model, first.sequences, mask, cache=first.cache)
            finally:
                self.max_new_tokens = n
            self.assertTrue(torch.equal(rest, whole.sequences))

    def test_past_key_values_format(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            fresh = model(input_ids, attention_mask=attention_mask, use_cache=True).cache
            self._check_past_key_values_for_generate(input_ids.shape[0], fresh, input_ids.shape[1], config)

    def _check_past_key_values_for_generate(self, batch_size, cache, seq_length, config):
        """Each layer as transformers reads its kind: a key/value layer's ``keys`` and ``values``
        (batch, heads, length, head_dim); a linear-attention layer's states through the cache's
        ``get_conv_state`` and ``get_recurrent_state``, and, where a mixer's filter is as long as
        the sequence, the input history that transformers' layers have no place for
        (``input_history``): ``_expected_cache`` gives each layer's shapes, None where it has
        no such part."""
        self.assertIsInstance(cache, Cache)
        self.assertTrue(cache.is_initialized)
        self.assertEqual(cache.get_seq_length(), seq_length)
        expected = self._expected_cache(config, batch_size, seq_length)
        self.assertEqual(len(cache.layers), len(expected))
        for index, (layer, shapes) in enumerate(zip(cache.layers, expected)):
            if "keys" in shapes:
                self.assertIsInstance(layer, CacheLayerMixin)
                self.assertEqual((layer.keys.shape, layer.values.shape), (shapes["keys"], shapes["values"]))
                continue
            self.assertIsInstance(layer, LinearAttentionCacheLayerMixin)
            got = {"conv": cache.get_conv_state(index), "recurrent": cache.get_recurrent_state(index),
                   "history": layer.input_history}
            self.assertEqual({k: None if t is None else t.shape for k, t in got.items()},
                             {k: shapes.get(k) for k in got}, f"layer {index}")
            if shapes.get("conv") or shapes.get("recurrent"):
                self.assertTrue(cache.has_previous_state(index))

    def test_assisted_decoding_is_refused_for_a_stateful_model(self):
        config, input_ids, attention_mask = self._generative_inputs()
        for model in self._models(config):
            with self.assertRaisesRegex(ValueError, "stateful"):
                model.generate(input_ids, attention_mask=attention_mask, prompt_lookup_num_tokens=2,
                               max_new_tokens=self.max_new_tokens)
