// Checked by `tsc --noEmit` (npm run build), never run: the package's types say what a result
// holds and refuse malformed requests, which they could not if anything were typed `any`.
import { createEngine, BadRequestError, type ChatCompletion, type Completion, type CreateEmbeddingResponse, type OpenAIEngine } from 'webshard';

export async function typesCheck(engine: OpenAIEngine): Promise<string[]> {
  const whole: ChatCompletion = await engine.chat.completions.create({
    messages: [{ role: 'user', content: 'hi' }],
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } },
  });
  const text: Completion = await engine.completions.create({ prompt: 'Once', max_tokens: 4 });
  const pieces: string[] = [whole.choices[0].message.content ?? '', text.choices[0].text, String(whole.usage.total_tokens)];
  for await (const chunk of await engine.chat.completions.create({ messages: [], stream: true })) {
    pieces.push(chunk.choices[0]?.delta.content ?? '');
  }
  // @ts-expect-error: temperature is a number
  await engine.chat.completions.create({ messages: [], temperature: 'hot' });
  // @ts-expect-error: roles are system, developer, user and assistant
  await engine.chat.completions.create({ messages: [{ role: 'robot', content: 'hi' }] });
  // @ts-expect-error: response_format types are text, json_object and json_schema
  await engine.chat.completions.create({ messages: [], response_format: { type: 'xml' } });
  // @ts-expect-error: a whole completion has no async iterator
  for await (const chunk of await engine.chat.completions.create({ messages: [] })) pieces.push(String(chunk));
  // @ts-expect-error: the model's URL is required
  await createEngine({ maxContext: 512 });
  const error = new BadRequestError('messages', 'must not be empty');
  pieces.push(error.param);
  return pieces;
}

export async function embeddingsTypesCheck(engine: OpenAIEngine): Promise<number[]> {
  const floats: CreateEmbeddingResponse = await engine.embeddings.create({ input: ['a', 'b'] });
  const packed: CreateEmbeddingResponse<string> = await engine.embeddings.create({ input: [[101, 102]], encoding_format: 'base64' });
  // @ts-expect-error: encoding formats are float and base64
  await engine.embeddings.create({ input: 'a', encoding_format: 'int8' });
  // @ts-expect-error: input is text or token ids
  await engine.embeddings.create({ input: [{ text: 'a' }] });
  const dims = engine.info.task === 'embeddings' ? engine.info.dimensions : 0;
  return [...floats.data[0].embedding, packed.data[0].embedding.length, floats.usage.prompt_tokens, dims];
}
